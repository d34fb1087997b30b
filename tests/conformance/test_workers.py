"""Worker calls (§16 "Yield and reentrancy": CPU·I/O workers; python-api §4 ``workers``)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT


class Work(zlink.Request[str], type_name="t.wk.work"):
    pool: str = "io"
    how: str = "await"
    fail: bool = False


class Note(zlink.Message, type_name="t.wk.note"):
    text: str


def _job(fail: bool) -> str:
    if fail:
        raise KeyError("from the worker")
    return threading.current_thread().name


async def _work(ctx: Any, req: Work) -> str:
    make = ctx.workers.io if req.pool == "io" else ctx.workers.cpu
    call = make(_job, req.fail)
    try:
        out: str = await (call.yield_() if req.how == "yield" else call)
    except zlink.InvalidOperation:
        return "InvalidOperation"
    except KeyError as exc:
        return f"KeyError:{exc.args[0]}"
    return out


def build_app(release: threading.Event, log: list[str]) -> zlink.App:
    app = zlink.App("workers")

    class Base(zlink.UserSpot):
        @zlink.handler
        async def work(self, req: Work) -> str:
            return await _work(self.context, req)

        @zlink.handler
        async def note(self, msg: Note) -> None:
            log.append(msg.text)
            if msg.text == "slow":
                await self.context.workers.io(release.wait, WAIT).yield_()
                log.append("slow:resumed")

    app.user_spot("t.wk.wide")(type("Wide", (Base,), {}))
    app.user_spot("t.wk.per", mode=zlink.ExecutionMode.PER_ACTOR)(type("Per", (Base,), {}))

    @app.instance_spot("t.wk.inst")
    class Inst(zlink.InstanceSpot):
        @zlink.handler
        async def work(self, req: Work) -> str:
            return await _work(self.context, req)

    @app.channel("t.wk.api")
    class Api:
        def __init__(self, context: zlink.ChannelContext) -> None:
            self.context = context

        @zlink.handler
        async def work(self, req: Work) -> str:
            return await _work(self.context, req)

    return app


@pytest.mark.parametrize("pool", ["io", "cpu"])
@pytest.mark.parametrize("how", ["await", "yield"])
def test_cpu_and_io_workers_offer_await_and_yield_in_spotwide_and_instance_turns(
    make_node, pool, how
):
    node = make_node(build_app(threading.Event(), []))
    client = node.client()
    client.spots.get_or_create("w", "t.wk.wide").wait(WAIT)
    out = client.request_to_spot("w", Work(pool=pool, how=how)).wait(WAIT)
    assert out.startswith(f"zlink-{pool}")  # ran on the worker pool, off the gate
    inst = client.request_to_spot("i", Work(pool=pool, how=how)).instance_spot().wait(WAIT)
    assert inst.startswith(f"zlink-{pool}")


@pytest.mark.parametrize("where", ["per_actor", "channel"])
def test_workers_offer_only_the_regular_await_in_per_actor_and_channel_turns(make_node, where):
    node = make_node(build_app(threading.Event(), []))
    client = node.client()
    client.spots.get_or_create("p", "t.wk.per").wait(WAIT)

    def ask(how: str) -> str:
        req = Work(how=how)
        call = (
            client.request_to_spot("p", req)
            if where == "per_actor"
            else client.request("t.wk.api", req)
        )
        result: str = call.wait(WAIT)
        return result

    assert ask("await").startswith("zlink-io")
    assert ask("yield") == "InvalidOperation"


def test_a_yielded_worker_call_lets_other_turns_of_the_spot_run(make_node):
    release, log = threading.Event(), []
    node = make_node(build_app(release, log))
    client = node.client()
    client.spots.get_or_create("w", "t.wk.wide").wait(WAIT)
    client.send_to_spot("w", Note(text="slow")).submit()
    client.send_to_spot("w", Note(text="other")).submit()
    assert client.request_to_spot("w", Work()).future().result(WAIT).startswith("zlink-io")
    assert log == ["slow", "other"]
    release.set()
    node.wait_idle(WAIT)
    assert log == ["slow", "other", "slow:resumed"]


def test_a_worker_exception_reaches_the_awaiting_handler_as_is(make_node):
    node = make_node(build_app(threading.Event(), []))
    client = node.client()
    client.spots.get_or_create("w", "t.wk.wide").wait(WAIT)
    out = client.request_to_spot("w", Work(fail=True)).wait(WAIT)
    assert out == "KeyError:from the worker"


def test_bad_worker_calls_are_refused_before_anything_runs(make_node):
    node = make_node(build_app(threading.Event(), []), worker_calls_in_flight=1)
    ctx_like = node._runtime.spots  # any context will do: use a Spot's
    client = node.client()
    client.spots.get_or_create("w", "t.wk.wide").wait(WAIT)
    workers = ctx_like["w"].context.workers
    with pytest.raises(zlink.InvalidArgument):
        workers.io(42)
    gate = threading.Event()
    first = workers.io(gate.wait, WAIT).future()
    with pytest.raises(zlink.ResourceExhausted):
        workers.cpu(sum, [1, 2]).future()
    gate.set()
    assert first.result(WAIT) is True
    assert workers.cpu(sum, [1, 2]).wait(WAIT) == 3
