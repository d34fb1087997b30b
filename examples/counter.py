"""A small ZLink app on an embedded node: a room counter, players that join it, a channel.

Run it: ``python -m examples.counter``. It prints what it did.
"""

from __future__ import annotations

import threading

import zlink


class Add(zlink.Message, type_name="counter.add"):
    amount: int


class Total(zlink.Request[int], type_name="counter.total"):
    pass


class Enter(zlink.Message, type_name="counter.enter"):
    room: str


class Score(zlink.Request[int], type_name="counter.score"):
    player: str


app = zlink.App("counter")


@app.user_spot("counter.room")  # SPOT_WIDE: one gate for the room and its members
class Room(zlink.UserSpot):
    def __init__(self, context: zlink.SpotContext) -> None:
        super().__init__(context)
        self.total = 0
        self.members: list[str] = []
        self.joined = threading.Event()

    @zlink.handler
    def add(self, msg: Add) -> None:
        self.total += msg.amount  # no lock: turns of one gate never overlap

    @zlink.handler
    async def get_total(self, req: Total) -> int:
        # ask the scoring channel, releasing the room's gate while we wait (Yield, §3)
        bonus = await self.context.outbound.request("counter.scores", Score(player="*")).yield_()
        return self.total + bonus

    def on_joined_actor(self, actor: zlink.Actor) -> None:
        self.members.append(actor.actor_id)


@app.entry_spot("counter.lobby", actor="counter.player")
class Lobby(zlink.EntrySpot):
    pass


@app.actor("counter.player")
class Player(zlink.Actor):
    def __init__(self, context: zlink.ActorContext) -> None:
        super().__init__(context)
        self.done = threading.Event()
        self.outcome: zlink.ActorJoinCompletion | None = None

    @zlink.handler
    def enter(self, msg: Enter) -> None:
        self.context.join(msg.room).defer()  # runs after this handler ends normally (§5)

    def on_join_completed(self, completion: zlink.ActorJoinCompletion) -> None:
        self.outcome = completion
        self.done.set()


@app.channel("counter.scores")
class Scores:
    def __init__(self, context: zlink.ChannelContext) -> None:
        self.context = context

    @zlink.handler
    def score(self, req: Score) -> int:
        return 100


def main() -> None:
    with zlink.Node(app, zlink.NodeConfig(node_id="demo")) as node:
        client = node.client()
        room = client.spots.get_or_create("room-1", "counter.room").wait(5)
        generation = room.spot_ref.object_generation
        print(
            f"created {room.spot_id} (generation {generation}: the number of this incarnation"
            " of the room, unique on the node (in a mesh: in its store); the Lobby, an Entry"
            " Spot, took 1; a room closed and made again, or re-homed, gets a new one, and"
            " spots.close(ref) closes only the incarnation its ref names)"
        )
        for _ in range(1000):
            client.send_to_spot("room-1", Add(amount=1)).submit()
        players = [client.actors.create("counter.player").wait(5).actor_id for _ in range(3)]
        for pid in players:
            client.send_to_actor(pid, Enter(room="room-1")).submit()
        total = client.request_to_spot("room-1", Total()).timeout(5).wait(5)
        print(f"room total after 1000 adds: {total - 100} (+100 bonus from the channel: {total})")
        node.wait_idle(5)
        print(f"players joined room-1: {len(players)}; node counters: {node.counters()}")
    print("node shut down cleanly")


if __name__ == "__main__":
    main()
