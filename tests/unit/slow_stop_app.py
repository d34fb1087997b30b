"""An app for ``zlink run`` tests: its Entry Spot holds a worker call that outlives any
graceful stop (``tests/unit/test_cli.py``). Importable as ``tests.unit.slow_stop_app:app``."""

from __future__ import annotations

import threading

import zlink

HOLD_SECONDS = 60.0  # longer than any test waits: the process must not wait for it

app = zlink.App("slow-stop")


class Hold(zlink.Message, type_name="slowstop.hold"):
    pass


def _hold() -> None:
    print("holding a worker call", flush=True)
    threading.Event().wait(HOLD_SECONDS)


@app.entry_spot("slowstop.lobby", actor="slowstop.player")
class Lobby(zlink.EntrySpot):
    def on_initialize(self) -> None:
        self.context.outbound.send_to_spot(self.context.spot_id, Hold()).submit()

    @zlink.handler
    async def hold(self, msg: Hold) -> None:
        await self.context.workers.io(_hold)


@app.actor("slowstop.player")
class Player(zlink.Actor):
    pass
