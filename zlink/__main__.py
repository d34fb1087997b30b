"""``python -m zlink``: the command line."""

from .cli import main

main()
