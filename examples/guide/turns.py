"""Yield against await, seen in the order of a room's turns (docs/guide/concepts.md).

A room asks a slow Channel, once keeping its turn (``await call``) and once yielding its gate
(``await call.yield_()``); meanwhile a ``Ping`` arrives. The room's log shows when the ping
ran. Run it with ``python -m examples.guide.turns``.
"""

from __future__ import annotations

import threading

import zlink


class AskAwait(zlink.Request[str], type_name="turns.ask_await"):
    pass


class AskYield(zlink.Request[str], type_name="turns.ask_yield"):
    pass


class Lookup(zlink.Request[str], type_name="turns.lookup"):
    pass


class Ping(zlink.Message, type_name="turns.ping"):
    pass


class GetLog(zlink.Request[list[str]], type_name="turns.get_log"):
    pass


# what the demo watches from outside the runtime (plain threading events)
lookup_started = threading.Event()
lookup_may_answer = threading.Event()
pinged = threading.Event()

app = zlink.App("turns")


# [start:room]
@app.user_spot("turns.room")
class Room(zlink.UserSpot):
    def __init__(self, context: zlink.SpotContext) -> None:
        super().__init__(context)
        self.log: list[str] = []

    @zlink.handler
    async def ask_await(self, req: AskAwait) -> str:
        self.log.append("ask: waiting, keeping the turn")
        answer: str = await self.context.outbound.request("turns.slow", Lookup())
        self.log.append(f"ask: resumed with {answer!r}")
        return answer

    @zlink.handler
    async def ask_yield(self, req: AskYield) -> str:
        self.log.append("ask: waiting, gate released")
        answer: str = await self.context.outbound.request("turns.slow", Lookup()).yield_()
        self.log.append(f"ask: resumed with {answer!r}")  # a new turn: re-check state here
        return answer

    @zlink.handler
    def ping(self, msg: Ping) -> None:
        self.log.append("ping")
        pinged.set()

    @zlink.handler
    def get_log(self, req: GetLog) -> list[str]:
        return list(self.log)


# [end:room]


@app.channel("turns.slow")
class Slow:
    def __init__(self, context: zlink.ChannelContext) -> None:
        self.context = context

    @zlink.handler
    def lookup(self, req: Lookup) -> str:
        lookup_started.set()
        lookup_may_answer.wait(5)  # a slow service: it answers when main() lets it
        return "42"


# [start:main]
def run(client: zlink.Client, room: str, ask: AskAwait | AskYield) -> list[str]:
    lookup_started.clear()
    lookup_may_answer.clear()
    pinged.clear()
    client.spots.get_or_create(room, "turns.room").wait(5)
    reply = client.request_to_spot(room, ask).future()
    assert lookup_started.wait(5)  # the room's handler is now waiting for the Channel
    client.send_to_spot(room, Ping()).submit()
    if isinstance(ask, AskYield):
        assert pinged.wait(5)  # the gate is free: the ping runs while the handler waits
    lookup_may_answer.set()
    reply.result(5)
    log: list[str] = client.request_to_spot(room, GetLog()).wait(5)
    return log


def main() -> None:
    with zlink.Node(app, zlink.NodeConfig(workers=2)) as node:
        client = node.client()
        print("await call:         ", run(client, "room-a", AskAwait()))
        print("await call.yield_():", run(client, "room-y", AskYield()))


if __name__ == "__main__":
    main()
# [end:main]
