"""The ``zlink`` command line (typer): ``zlink run MODULE:ATTR`` starts an embedded node."""

from __future__ import annotations

import importlib
import logging
import signal
import sys
import threading
from typing import Annotated, Any

import typer

from ..app import App
from ..config import NodeConfig
from ..errors import InvalidArgument
from ..node import Node

cli = typer.Typer(
    add_completion=False, help="ZLink for Python: Spots and Actors, one turn at a time."
)


def load(target: str, factory: bool = False) -> Any:
    """Import ``MODULE:ATTR``; call it when ``factory`` is set."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidArgument(f"expected MODULE:ATTR, got {target!r}")
    module = importlib.import_module(module_name)
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise InvalidArgument(f"module {module_name!r} has no attribute {attr!r}") from None
    return obj() if factory else obj


@cli.command()
def run(
    target: Annotated[
        str, typer.Argument(help="MODULE:ATTR of a zlink.App, or of a main() function")
    ],
    factory: Annotated[bool, typer.Option(help="ATTR is a factory returning an App")] = False,
    node_id: Annotated[str, typer.Option(help="this node's id")] = "node-1",
    workers: Annotated[int | None, typer.Option(help="worker threads (default: cores)")] = None,
) -> None:
    """Start a node for an App and serve until SIGINT/SIGTERM; a callable ATTR is just run."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    obj = load(target, factory)
    if not isinstance(obj, App):
        if callable(obj):
            obj()
            return
        raise typer.BadParameter(f"{target} is neither a zlink.App nor callable")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with Node(obj, NodeConfig(node_id=node_id, workers=workers)) as node:
        typer.echo(f"{node!r} serving {obj.describe()}; Ctrl-C stops it")
        stop.wait()
    typer.echo("stopped")


@cli.command()
def version() -> None:
    """Print the ZLink version and the interpreter it runs on."""
    from .. import __version__

    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    typer.echo(
        f"zlink {__version__} on Python {sys.version.split()[0]} (GIL {'on' if gil else 'off'})"
    )


def main() -> None:
    """Console entry point."""
    cli()
