import zlink


class Add(zlink.Message, type_name="counter.add"):
    amount: int


class Total(zlink.Request[int], type_name="counter.total"):
    pass


app = zlink.App("counter")


@app.user_spot("counter.room")  # SPOT_WIDE: one gate for the Spot and its Actors
class Room(zlink.UserSpot):
    def __init__(self, context: zlink.SpotContext) -> None:
        super().__init__(context)
        self.total = 0

    @zlink.handler
    def add(self, msg: Add) -> None:  # no lock: turns of one gate never overlap
        self.total += msg.amount

    @zlink.handler
    def get_total(self, req: Total) -> int:
        return self.total


if __name__ == "__main__":
    with zlink.Node(app, zlink.NodeConfig(node_id="n1")) as node:
        client = node.client()
        client.spots.get_or_create("room-1", "counter.room").wait(5)
        client.send_to_spot("room-1", Add(amount=2)).submit()
        print(client.request_to_spot("room-1", Total()).timeout(5).wait(5))  # 2
