"""A timer on a Spot, driven by a manual clock so that its ticks are exact (docs/guide/concepts.md).

Run it with ``python -m examples.guide.timers``.
"""

from __future__ import annotations

import zlink
from zlink.testing import ManualClock


class Start(zlink.Message, type_name="timers.start"):
    every: float


class Ticks(zlink.Request[list[str]], type_name="timers.ticks"):
    pass


app = zlink.App("timers")


# [start:spot]
@app.user_spot("timers.kettle")
class Kettle(zlink.UserSpot):
    def __init__(self, context: zlink.SpotContext) -> None:
        super().__init__(context)
        self.seen: list[str] = []

    @zlink.handler
    def start(self, msg: Start) -> None:
        self.context.timers.register("boil", msg.every)  # first tick one interval from now

    @zlink.timer_handler("boil")
    def on_boil(self, tick: zlink.TimerTick) -> None:  # shares the Spot's gate (SPOT_WIDE)
        self.seen.append(f"tick {tick.sequence} (skipped before it: {tick.late_ticks})")
        if tick.sequence == 3:
            self.context.timers.cancel("boil")

    @zlink.handler
    def ticks(self, req: Ticks) -> list[str]:
        return list(self.seen)


# [end:spot]


# [start:main]
def main() -> None:
    clock = ManualClock()  # time moves only when told: every tick below is exact
    with zlink.Node(app, zlink.NodeConfig(workers=2), clock=clock) as node:
        client = node.client()
        client.spots.get_or_create("kettle", "timers.kettle").wait(5)
        client.send_to_spot("kettle", Start(every=1.0)).submit()
        node.wait_idle(5)
        for step in (1.0, 1.0, 5.0, 1.0):  # the third step stands for five periods
            clock.advance(step)
            node.wait_idle(5)
        for line in client.request_to_spot("kettle", Ticks()).wait(5):
            print(line)


if __name__ == "__main__":
    main()
# [end:main]
