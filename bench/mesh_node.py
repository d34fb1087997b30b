"""Node ``a`` of ``bench.mesh`` (a subprocess): owns the counter Spot until stdin closes.

    python -m bench.mesh_node sqlite:///PATH

Also the app both sides of the benchmark import.
"""

from __future__ import annotations

import sys

import zlink


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
    config = zlink.NodeConfig(node_id="a", listen="tcp://127.0.0.1:0", store=sys.argv[1], workers=2)
    with zlink.Node(app, config) as node:
        node.client().spots.get_or_create("counter", "bench.mesh.counter").wait(10)
        print("ready", flush=True)
        sys.stdin.read()  # until the benchmark closes it


if __name__ == "__main__":
    main()
