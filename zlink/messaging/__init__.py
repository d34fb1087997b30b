"""Messages, their codec, calls and contexts (python-api §1, §4)."""
