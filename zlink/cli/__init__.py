"""The ``zlink`` command line (typer): ``zlink run MODULE:ATTR`` starts an embedded node."""

from __future__ import annotations

import importlib
import logging
import os
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


def _app_dir() -> None:
    """Import from the working directory, as ``python -m`` would (uvicorn's ``--app-dir .``)."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)


def load(target: str, factory: bool = False) -> Any:
    """Import ``MODULE:ATTR``; call it when ``factory`` is set."""
    _app_dir()
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


bingo_cli = typer.Typer(add_completion=False, help="The Bingo sample (examples/bingo).")
cli.add_typer(bingo_cli, name="bingo")


@bingo_cli.command("play")
def bingo_play(
    rooms: Annotated[int, typer.Option(min=1, help="rooms, one game each")] = 4,
    players: Annotated[int, typer.Option(min=1, help="players per room")] = 8,
    nodes: Annotated[int, typer.Option(min=1, help="nodes (more than 1 needs the mesh)")] = 1,
    draw_ms: Annotated[float, typer.Option(min=0.1, help="milliseconds between draws")] = 5.0,
    workers: Annotated[int | None, typer.Option(help="worker threads (default: cores)")] = None,
) -> None:
    """Play one Bingo game per room on an embedded node and print a summary."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    if nodes != 1:
        raise typer.BadParameter("several nodes arrive with the mesh (issue 4); use --nodes 1")
    _app_dir()
    try:
        from examples.bingo.play import play
    except ImportError as exc:
        raise typer.BadParameter(f"run from the repository root: {exc}") from exc
    console = Console()
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("games finished", total=rooms)
        summary = play(
            rooms,
            players,
            draw_interval=draw_ms / 1000,
            workers=workers,
            progress=lambda done, total: bar.update(task, completed=done),
        )
    table = Table(title="Bingo", show_header=False)
    for key, value in (
        ("rooms / players", f"{summary.rooms} / {summary.players}"),
        ("games finished", str(summary.games)),
        ("winners", str(len(summary.winners))),
        ("messages", f"{summary.messages:,}"),
        ("draw -> mark latency", f"p50 {summary.p50_ms:.2f} ms, p99 {summary.p99_ms:.2f} ms"),
        ("wall time", f"{summary.seconds:.2f} s on {summary.workers} workers"),
        ("handler errors", str(summary.counters.get("handler_errors", 0))),
    ):
        table.add_row(key, value)
    console.print(table)
    if summary.games != rooms:
        raise typer.Exit(1)


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
