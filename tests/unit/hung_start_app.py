"""An app for ``zlink run`` tests: its Entry Spot's ``on_initialize`` waits on a dependency
that never answers, so the node never finishes starting (``tests/unit/test_cli.py``).
Importable as ``tests.unit.hung_start_app:app``."""

from __future__ import annotations

import threading

import zlink

HANG_SECONDS = 60.0  # longer than any test waits: the process must not wait for it

app = zlink.App("hung-start")


@app.entry_spot("hungstart.lobby", actor="hungstart.player")
class Lobby(zlink.EntrySpot):
    def on_initialize(self) -> None:
        print("initializing: waiting on a dependency", flush=True)
        threading.Event().wait(HANG_SECONDS)


@app.actor("hungstart.player")
class Player(zlink.Actor):
    pass
