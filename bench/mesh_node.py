"""Node ``a`` of ``bench.mesh`` (a subprocess): owns the counter Spot until stdin closes.

    python -m bench.mesh_node STORE_URL [--lease SECONDS]

Also the app both sides of the benchmark import.
"""

from __future__ import annotations

import sys
import time

import zlink
from bench.core import Shared


class Tick(zlink.Message, type_name="bench.mesh.tick"):
    pass


class Count(zlink.Request[int], type_name="bench.mesh.count"):
    pass


app = zlink.App("bench-mesh")


@app.user_spot("bench.mesh.counter")
class Counter(zlink.UserSpot):
    def __init__(self, context: zlink.SpotContext) -> None:
        super().__init__(context)
        self.n = 0

    @zlink.handler
    def tick(self, msg: Tick) -> None:
        self.n += 1

    @zlink.handler
    def count(self, req: Count) -> int:
        return self.n


HITS = Shared(-1)  # messages the fan-out cells of this process handled; target per run


@app.user_spot("bench.mesh.cell")
class Cell(zlink.UserSpot):
    __slots__ = ()

    @zlink.handler
    def tick(self, msg: Tick) -> None:
        HITS.hit()


def fanout(node_id: str, store: str) -> None:
    """A node that fans out to its own Spots on command (``bench.mesh``'s fan-out rows):
    ``setup N`` makes N cells here; ``run K R`` sends R rounds of one message to each of the
    first K, from this process, and prints the seconds until all were handled."""
    config = zlink.NodeConfig(node_id=node_id, listen="tcp://127.0.0.1:0", store=store, workers=2)
    with zlink.Node(app, config) as node:
        client = node.client()
        print("ready", flush=True)
        ids: list[str] = []
        msg = Tick()
        for line in sys.stdin:
            words = line.split()
            if words[0] == "setup":
                ids = [f"{node_id}-cell-{i}" for i in range(int(words[1]))]
                for start in range(0, len(ids), 200):
                    made = [client.spots.get_or_create(c, "bench.mesh.cell").future()
                            for c in ids[start : start + 200]]  # fmt: skip
                    for future in made:
                        future.result(60)
                print("set", flush=True)
            elif words[0] == "run":
                cells, rounds = ids[: int(words[1])], int(words[2])
                with HITS.lock:
                    HITS.count, HITS.target = 0, len(cells) * rounds
                    HITS.done.clear()
                t0 = time.perf_counter()
                for _ in range(rounds):
                    for cell in cells:
                        client.send_to_spot(cell, msg).submit()
                HITS.done.wait(120)
                print(f"done {time.perf_counter() - t0}", flush=True)


def echo() -> None:
    """A bare pyzmq ROUTER that echoes every frame (``bench.mesh``'s floor)."""
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    print(f"ready tcp://127.0.0.1:{port}", flush=True)
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(sys.stdin, zmq.POLLIN)
    while True:
        ready = dict(poller.poll())
        if sys.stdin.fileno() in ready or sys.stdin in ready:
            break
        if sock in ready:
            sock.send_multipart(sock.recv_multipart())
    ctx.destroy(linger=0)


def main() -> None:
    if sys.argv[1:] == ["--echo"]:
        echo()
        return
    if sys.argv[1] == "--fanout":
        fanout(sys.argv[2], sys.argv[3])
        return
    lease = float(sys.argv[3]) if sys.argv[2:3] == ["--lease"] else 3.0
    config = zlink.NodeConfig(
        node_id="a", listen="tcp://127.0.0.1:0", store=sys.argv[1], workers=2, lease_seconds=lease
    )
    with zlink.Node(app, config) as node:
        node.client().spots.get_or_create("counter", "bench.mesh.counter").wait(10)
        print("ready", flush=True)
        sys.stdin.read()  # until the benchmark closes it


if __name__ == "__main__":
    main()
