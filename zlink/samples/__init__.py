"""Sample applications that ship with the package (``zlink bingo play`` runs from any folder).

A sample is an application like any other: it imports only the public ``zlink`` names (and
``zlink.testing``), and nothing in ``zlink`` but the command line imports a sample.
"""
