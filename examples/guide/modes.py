"""SPOT_WIDE against PER_ACTOR: who shares a gate (docs/guide/concepts.md).

Two players join a SPOT_WIDE hall and two join a PER_ACTOR arcade. In the hall, their handlers
never overlap; in the arcade, each player has a gate of its own, so two handlers can run at
once (here they must, to meet at a barrier). Run it with ``python -m examples.guide.modes``.
"""

from __future__ import annotations

import threading

import zlink


class Enter(zlink.Message, type_name="modes.enter"):
    spot: str


class Where(zlink.Request[str], type_name="modes.where"):
    pass


class Work(zlink.Message, type_name="modes.work"):
    pass


class Meet(zlink.Request[str], type_name="modes.meet"):
    pass


class Overlap:
    """How many handlers run at once, and the most there ever were (a demo's lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0

    def __enter__(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.now -= 1


in_hall = Overlap()
barrier = threading.Barrier(2, timeout=5)

# [start:registration]
app = zlink.App("modes")


@app.user_spot("modes.hall")  # mode=zlink.ExecutionMode.SPOT_WIDE, the default
class Hall(zlink.UserSpot):
    pass


@app.user_spot("modes.arcade", mode=zlink.ExecutionMode.PER_ACTOR)
class Arcade(zlink.UserSpot):
    pass


@app.entry_spot("modes.lobby", actor="modes.player")
class Lobby(zlink.EntrySpot):
    pass


@app.actor("modes.player")
class Player(zlink.Actor):
    @zlink.handler
    def enter(self, msg: Enter) -> None:
        self.context.join(msg.spot).defer()

    @zlink.handler
    def where(self, req: Where) -> str:
        return self.context.spot_id

    @zlink.handler
    def work(self, msg: Work) -> None:
        with in_hall:  # counts the handlers running at this moment
            sum(range(10_000))

    @zlink.handler
    def meet(self, req: Meet) -> str:
        barrier.wait()  # passes only when both players are inside this handler at once
        return "met"


# [end:registration]


def main() -> None:
    with zlink.Node(app, zlink.NodeConfig(workers=2)) as node:
        client = node.client()
        for spot, spot_type in (("hall", "modes.hall"), ("arcade", "modes.arcade")):
            client.spots.get_or_create(spot, spot_type).wait(5)
        players = {"hall": ["h1", "h2"], "arcade": ["a1", "a2"]}
        for spot, ids in players.items():
            for actor_id in ids:
                client.actors.create("modes.player", actor_id=actor_id).wait(5)
                client.send_to_actor(actor_id, Enter(spot=spot)).submit()
                assert client.request_to_actor(actor_id, Where()).wait(5) == spot

        for _ in range(200):
            for actor_id in players["hall"]:
                client.send_to_actor(actor_id, Work()).submit()
        node.wait_idle(10)
        print(f"hall (SPOT_WIDE): at most {in_hall.most} handler at a time")

        met = [client.request_to_actor(a, Meet()).future() for a in players["arcade"]]
        print(f"arcade (PER_ACTOR): both players {met[0].result(5)}, inside a handler at once")


if __name__ == "__main__":
    main()
