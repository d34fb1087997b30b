"""Every ZLink error, provoked on purpose and caught (docs/guide/errors.md).

Run it with ``python -m examples.guide.errors``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import zlink


class Add(zlink.Message, type_name="errors.add"):
    amount: int


class Hold(zlink.Message, type_name="errors.hold"):
    pass


class Total(zlink.Request[int], type_name="errors.total"):
    pass


class Divide(zlink.Request[float], type_name="errors.divide"):
    by: int


class AskMyself(zlink.Request[str], type_name="errors.ask_myself"):
    pass


class Slow(zlink.Request[str], type_name="errors.slow"):
    pass


class WaitForSlow(zlink.Request[str], type_name="errors.wait_for_slow"):
    pass


release = threading.Event()  # lets held handlers go on (the demo drives them from main)
app = zlink.App("errors")


@app.user_spot("errors.box")
class Box(zlink.UserSpot):
    def __init__(self, context: zlink.SpotContext) -> None:
        super().__init__(context)
        self.total = 0

    @zlink.handler
    def add(self, msg: Add) -> None:
        self.total += msg.amount

    @zlink.handler
    def hold(self, msg: Hold) -> None:
        release.wait(5)  # keeps the gate busy until main() releases it

    @zlink.handler
    def get_total(self, req: Total) -> int:
        return self.total

    @zlink.handler
    def divide(self, req: Divide) -> float:
        return self.total / req.by  # ZeroDivisionError for by=0

    # [start:self_wait]
    @zlink.handler
    async def ask_myself(self, req: AskMyself) -> str:
        try:  # awaiting a request to its own Spot would wait on its own gate
            await self.context.outbound.request_to_spot(self.context.spot_id, Total())
        except zlink.InvalidOperation as exc:
            return f"InvalidOperation: {exc}"
        return "unreachable"

    # [end:self_wait]

    # [start:cancelled]
    @zlink.handler
    async def wait_for_slow(self, req: WaitForSlow) -> str:
        try:
            answer: str = await self.context.outbound.request("errors.slow", Slow()).yield_()
        except zlink.Cancelled:  # the Spot is closing and its close deadline passed
            cancelled.set()
            raise  # (the caller of this request gets a HandlerError naming Cancelled)
        return answer

    # [end:cancelled]


cancelled = threading.Event()
slow_started = threading.Event()


@app.channel("errors.slow")
class SlowService:
    def __init__(self, context: zlink.ChannelContext) -> None:
        self.context = context

    @zlink.handler
    def slow(self, req: Slow) -> str:
        slow_started.set()
        release.wait(5)
        return "late"


# [start:show]
def show(what: str, attempt: Callable[[], object]) -> None:
    """Run ``attempt``; print the ZLink error it raised (its class, code and first line)."""
    try:
        attempt()
    except zlink.ZLinkError as exc:
        first_line = str(exc).splitlines()[0]
        print(f"{what}\n  -> {type(exc).__name__} ({exc.code}): {first_line}")
    else:
        print(f"{what}\n  -> no error")


# [end:show]


# [start:main]
def main() -> None:
    # small limits, so that the demo meets them at once
    config = zlink.NodeConfig(
        workers=2, app_lane_items=2, admission_timeout=0.05, closing_timeout=0.2
    )
    node = zlink.Node(app, config)
    show("a client before start()", node.client)
    node.start()
    client = node.client()
    box = client.spots.get_or_create("box", "errors.box").wait(5)

    show("an empty SpotId", lambda: client.send_to_spot("", Add(amount=1)))
    show("a payload that fails validation", lambda: Add(amount="many"))  # type: ignore[arg-type]
    show(
        "a request to a Spot nobody created",
        lambda: client.request_to_spot("nope", Total()).wait(5),
    )
    show("a handler that raises", lambda: client.request_to_spot("box", Divide(by=0)).wait(5))
    print(
        "a handler that awaits its own Spot\n  ->",
        client.request_to_spot("box", AskMyself()).wait(5),
    )
    call = client.send_to_spot("box", Add(amount=1))
    call.submit()
    show("a second terminal on one call", call.submit)
    node.wait_idle(5)

    client.send_to_spot("box", Hold()).submit()  # runs, and keeps the gate busy
    client.send_to_spot("box", Add(amount=1)).submit()  # queued: the lane (2 items) is full
    show("submit() to a full lane", lambda: client.send_to_spot("box", Add(amount=1)).submit())
    show(
        "wait() for room that does not come",
        lambda: client.send_to_spot("box", Add(amount=1)).wait(),  # admission_timeout
    )
    show(
        "a request whose timeout passes",
        lambda: client.request_to_spot("box", Total()).timeout(0.05).wait(5),
    )
    release.set()
    node.wait_idle(5)
    print("the total now:", client.request_to_spot("box", Total()).wait(5))

    class Odd:
        def __init__(self) -> None:
            self.seen = {1, 2}  # a set is not JSON

    show("state JsonStateAdapter cannot capture", lambda: zlink.JsonStateAdapter().capture(Odd()))

    release.clear()
    waiting = client.request_to_spot("box", WaitForSlow()).future()
    assert slow_started.wait(5)  # the handler now waits for the slow Channel
    client.spots.close(box.spot_ref)  # waits for the suspended handler, up to closing_timeout
    show("a close that passes its deadline", lambda: waiting.result(5))
    release.set()
    print("the handler saw Cancelled:", cancelled.wait(5))
    node.wait_idle(5)  # the close ends once the cancelled handler has
    show(
        "a request to a Spot that was closed",
        lambda: client.request_to_spot("box", Total()).wait(5),
    )

    node.shutdown()
    show("a call after shutdown()", lambda: client.request_to_spot("box", Total()).wait(5))


if __name__ == "__main__":
    main()
# [end:main]
