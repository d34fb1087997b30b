"""Three nodes in one process: placement, routing, relocation and drain (docs/guide/mesh.md).

``zlink.testing.LocalCluster`` runs the nodes of one App in this process over an in-process
transport and an in-memory Location Store, exactly as node processes share a store and talk
over ZeroMQ. Run it with ``python -m examples.guide.cluster``.
"""

from __future__ import annotations

import zlink
from zlink.testing import LocalCluster


class Add(zlink.Message, type_name="cluster.add"):
    amount: int


class Where(zlink.Request[str], type_name="cluster.where"):
    pass


# [start:app]
app = zlink.App("cluster")


class Counter(zlink.UserSpot):
    def __init__(self, context: zlink.SpotContext) -> None:
        super().__init__(context)
        self.total = 0  # plain state: JsonStateAdapter captures it as JSON

    @zlink.handler
    def add(self, msg: Add) -> None:
        self.total += msg.amount

    @zlink.handler
    def where(self, req: Where) -> str:
        return f"total {self.total} on {self.context.spot_ref.node_rid}"


@app.user_spot("cluster.kept", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter))
class Kept(Counter):
    """Moves with its state."""


@app.user_spot("cluster.fresh", relocation=zlink.Relocation.recreate())
class Fresh(Counter):
    """Moves as a fresh instance: its state starts again."""


@app.user_spot("cluster.pinned")  # a SPOT_WIDE User Spot's default: Relocation.disabled()
class Pinned(Counter):
    """Never moves."""


# [end:app]


# [start:main]
def main() -> None:
    with LocalCluster(app, nodes=3, workers=2) as cluster:
        n1, n2, n3 = cluster.nodes
        c1, c2, c3 = n1.client(), n2.client(), n3.client()
        for client, spot_id, spot_type in (
            (c1, "kept", "cluster.kept"),
            (c1, "fresh", "cluster.fresh"),
            (c2, "pinned", "cluster.pinned"),
        ):
            client.spots.get_or_create(spot_id, spot_type).wait(5)  # placed where it is asked
            client.send_to_spot(spot_id, Add(amount=3)).submit()

        # any node reaches any Spot: node-3 asks the store once, then routes to node-1
        print("asked on node-3:", c3.request_to_spot("kept", Where()).wait(5))

        n1.relocate_spot("kept", target="node-2")  # on the owner; blocks until committed
        n1.relocate_spot("fresh", target="node-2")
        print("moved to node-2:")
        for spot_id in ("kept", "fresh"):
            print(f"  {spot_id}: {c3.request_to_spot(spot_id, Where()).wait(5)}")

        drained = n2.drain()  # what can move goes to the other nodes, round robin
        print(f"node-2 drained: moved {drained.moved}, stayed {drained.stayed}")
        for spot_id in ("kept", "fresh", "pinned"):
            print(f"  {spot_id}: {c3.request_to_spot(spot_id, Where()).wait(5)}")
        try:  # a drained node still relays and serves what stayed, but takes no new calls
            c2.send_to_spot("kept", Add(amount=1)).submit()
        except zlink.Unavailable as exc:
            print(f"a call made on node-2 now: Unavailable ({exc})")


if __name__ == "__main__":
    main()
# [end:main]
