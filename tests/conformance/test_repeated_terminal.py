"""python-api §11 "A repeated terminal": a second terminal on one call object (``defer()``
twice, ``wait()`` after ``submit()``, ...) raises ``InvalidOperation`` and has no effect at
all: nothing is registered or sent by the repeat. Every call class, every terminal; the
``defer()`` terminals are tested where their calls live (test_actor_join_and_defer.py,
test_relocation_signaled.py)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT


class Put(zlink.Message, type_name="t.rt.put"):
    pass


class Count(zlink.Request[int], type_name="t.rt.count"):
    pass


class Repeat(zlink.Request[str], type_name="t.rt.repeat"):
    how: str


class Effects:
    """What the calls did, counted where they landed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.puts = 0
        self.counts = 0
        self.creates = 0
        self.work = 0

    def add(self, what: str) -> None:
        with self.lock:
            setattr(self, what, getattr(self, what) + 1)


def build_app(effects: Effects) -> zlink.App:
    app = zlink.App("repeat")

    @app.user_spot("t.rt.box")
    class Box(zlink.UserSpot):
        def on_create(self, request: Any) -> None:
            effects.add("creates")

        @zlink.handler
        def put(self, msg: Put) -> None:
            effects.add("puts")

        @zlink.handler
        def count(self, req: Count) -> int:
            effects.add("counts")
            return 1

    def work() -> int:
        effects.add("work")
        return 1

    @app.user_spot("t.rt.caller")
    class Caller(zlink.UserSpot):
        @zlink.handler
        async def repeat(self, req: Repeat) -> str:
            out = self.context.outbound
            second: Callable[[Any], Any]
            call: Any
            if req.how.startswith("request"):
                call = out.request_to_spot("box", Count())
            elif req.how.startswith("send"):
                call = out.send_to_spot("box", Put())
            elif req.how.startswith("batch"):
                call = out.send_many_to_spot("box", [Put()])
            elif req.how.startswith("create"):
                call = self.context.spots.create("t.rt.box")
            else:
                call = self.context.workers.io(work)
            terminal = req.how.split(":")[1]
            if terminal == "await-await":
                await call
                second = _awaited
            elif terminal == "yield-await":
                await call.yield_()
                second = _awaited
            elif terminal == "await-yield":
                await call
                second = _yielded
            elif terminal == "yield-yield":
                await call.yield_()
                second = _yielded
            elif terminal == "spent-yield":  # one yield_() awaitable, awaited twice
                awaitable = call.yield_()
                await awaitable
                call, second = awaitable, _awaited
            else:  # "submit-await"
                call.submit()
                second = _awaited
            try:
                await second(call)
            except zlink.InvalidOperation:
                return "InvalidOperation"
            return "repeated"

    return app


async def _awaited(call: Any) -> Any:
    return await call


async def _yielded(call: Any) -> Any:
    return await call.yield_()


@pytest.fixture
def effects() -> Effects:
    return Effects()


@pytest.fixture
def node(make_node, effects):
    node = make_node(build_app(effects))
    client = node.client()
    client.spots.get_or_create("box", "t.rt.box").wait(WAIT)
    client.spots.get_or_create("caller", "t.rt.caller").wait(WAIT)
    with effects.lock:
        effects.creates = 0
    return node


def _run(call: Any, terminal: str) -> None:
    """One outside terminal, run to its end."""
    if terminal == "submit":
        call.submit()
    elif terminal == "wait":
        call.wait(WAIT)
    else:
        call.future().result(WAIT)


OUTSIDE: dict[str, tuple[Callable[[zlink.Client], Any], tuple[str, ...], str]] = {
    "send": (lambda c: c.send_to_spot("box", Put()), ("submit", "wait", "future"), "puts"),
    "request": (lambda c: c.request_to_spot("box", Count()), ("wait", "future"), "counts"),
    "create": (lambda c: c.spots.create("t.rt.box"), ("wait", "future"), "creates"),
    "batch": (lambda c: c.send_many_to_spot("box", [Put()]), ("submit",), "puts"),
}
OUTSIDE_CASES = [
    (kind, a, b)
    for kind, (_make, terminals, _effect) in OUTSIDE.items()
    for a, b in itertools.product(terminals, repeat=2)
]


@pytest.mark.parametrize(("kind", "first", "second"), OUTSIDE_CASES)
def test_a_second_terminal_outside_the_runtime_raises_and_sends_nothing(
    node, effects, kind, first, second
):
    make, _terminals, effect = OUTSIDE[kind]
    call = make(node.client())
    _run(call, first)
    with pytest.raises(zlink.InvalidOperation, match="one terminal"):
        _run(call, second)
    assert node.wait_idle(WAIT)
    assert getattr(effects, effect) == 1


INSIDE = [
    ("request:await-await", "counts"),
    ("request:yield-await", "counts"),
    ("request:await-yield", "counts"),
    ("request:yield-yield", "counts"),
    ("request:spent-yield", "counts"),
    ("create:await-await", "creates"),
    ("create:yield-await", "creates"),
    ("create:await-yield", "creates"),
    ("worker:await-await", "work"),
    ("worker:yield-await", "work"),
    ("worker:await-yield", "work"),
    ("send:submit-await", "puts"),
    ("batch:submit-await", "puts"),
]


@pytest.mark.parametrize(("how", "effect"), INSIDE)
def test_a_second_terminal_in_a_handler_raises_and_sends_nothing(node, effects, how, effect):
    client = node.client()
    assert client.request_to_spot("caller", Repeat(how=how)).wait(WAIT) == "InvalidOperation"
    assert node.wait_idle(WAIT)
    assert getattr(effects, effect) == 1
