"""Spots, Actors and Channels: the classes users subclass and their runtime activations."""
