"""A Spot's activation and close racing the calls made to it (kotlin-spot-interface
lifecycle; concepts "Lifecycle": the constructor, ``on_create`` and ``on_initialize`` run
before any message; python-api §5: every call ends once, with a typed error at worst).

Found by a probe on 3.13t: a message that found a Spot being made ran before its constructor
(``self`` was ``None`` in the handler); a call that met a Spot a close was taking out of the
node's table was routed to it again and again until the caller's stack ran out (a segfault
there, ``RecursionError`` on 3.11); an idle eviction closed a Spot that had just admitted a
message, and discarded it. Each test below holds the race open with a hook or a lock, so each
fails every time without its fix.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT
from zlink.runtime.creation import Creation
from zlink.testing import ManualClock


class Ping(zlink.Request[str], type_name="t.ar.ping"):
    pass


class Bump(zlink.Message, type_name="t.ar.bump"):
    pass


CLOSING, CLOSE_GO = threading.Event(), threading.Event()
BUMPS: list[str] = []


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    CLOSING.clear()
    CLOSE_GO.set()  # on_closing goes on at once unless a test holds it
    BUMPS.clear()
    yield
    CLOSE_GO.set()


def build_app() -> zlink.App:
    app = zlink.App("activation-races")

    @app.user_spot("t.ar.room")
    class Room(zlink.UserSpot):
        def __init__(self, context: zlink.SpotContext) -> None:
            super().__init__(context)
            self.ready = False

        def on_initialize(self) -> None:
            self.ready = True

        @zlink.handler
        def ping(self, req: Ping) -> str:
            return "ready" if self.ready else "not initialized"

        @zlink.handler
        def bump(self, msg: Bump) -> None:
            BUMPS.append(self.context.spot_id)

        def on_closing(self, closing: zlink.SpotClosingContext) -> None:
            CLOSING.set()
            assert CLOSE_GO.wait(WAIT)

    return app


def _outcome(fn: Callable[[], Any]) -> Any:
    """``fn()``'s value, or the exception it raised (any: a non-ZLink one is the fault)."""
    try:
        return fn()
    except BaseException as exc:  # noqa: BLE001 - what the caller would have met
        return exc


def test_a_call_that_finds_a_spot_being_made_runs_after_its_activation(make_node, monkeypatch):
    """The Spot was in the node's table before its activation was queued: a request that
    found it in that moment ran on a worker ahead of the constructor (a ``HandlerError``,
    ``AttributeError`` on ``None``). The hook asks at exactly that moment."""
    node = make_node(build_app())
    client = node.client()
    seen: list[Any] = []
    activate = Creation.activate

    def activate_late(self: Creation, act: Any, *args: Any, **kwargs: Any) -> None:
        if act.spot_id == "room" and not seen:  # (runs on the thread that makes it)
            ask = client.request_to_spot("room", Ping()).timeout(WAIT)
            seen.append(_outcome(lambda: ask.wait(WAIT)))
        activate(self, act, *args, **kwargs)

    monkeypatch.setattr(Creation, "activate", activate_late)
    client.spots.get_or_create("room", "t.ar.room").wait(WAIT)
    assert len(seen) == 1
    assert seen[0] == "ready" or isinstance(seen[0], zlink.NotFound), repr(seen[0])
    assert client.request_to_spot("room", Ping()).wait(WAIT) == "ready"
    assert not node.counters().get("handler_errors")


def test_a_call_that_meets_a_spot_a_close_is_taking_out_ends_with_a_typed_error(make_node):
    """The close marked the Spot gone before it took it out of the table (under the
    directory lock): a call that met it in between was routed to it again, and again, until
    the caller's stack ran out. The test holds the directory lock, so the close stops right
    there, and calls."""
    node = make_node(build_app())
    client = node.client()
    ref = client.spots.get_or_create("room", "t.ar.room").wait(WAIT).spot_ref
    rt = node._runtime
    act = rt.spots["room"]
    outcome: list[Any] = []
    CLOSE_GO.clear()
    assert client.spots.close(ref)
    assert CLOSING.wait(WAIT)  # on_closing runs, and waits
    lock = rt.directory.lock
    lock.acquire()
    try:
        CLOSE_GO.set()
        deadline = time.monotonic() + WAIT
        while act.closing_turn is not None:  # on_closing ended: the close goes on to the lock
            assert time.monotonic() < deadline, "on_closing never ended"
            time.sleep(0.001)
        ask = client.request_to_spot("room", Ping()).timeout(WAIT)
        caller = threading.Thread(target=lambda: outcome.append(_outcome(lambda: ask.wait(WAIT))))
        caller.start()
        caller.join(0.2)  # it ends now (the fault) or waits for the lock (the fix)
    finally:
        lock.release()
    caller.join(WAIT)
    assert len(outcome) == 1
    assert isinstance(outcome[0], zlink.ZLinkError), repr(outcome[0])
    node.wait_idle(WAIT)
    assert "room" not in rt.spots


def _blocked_in(names: set[str], thread_name_part: str) -> bool:
    """Whether a thread whose name has ``thread_name_part`` now runs one of ``names``."""
    threads = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        if thread_name_part not in threads.get(ident, ""):
            continue
        f: Any = frame
        while f is not None:
            if f.f_code.co_name in names:
                return True
            f = f.f_back
    return False


def test_an_idle_eviction_never_discards_a_message_admitted_as_it_decides(
    make_node, clock: ManualClock
):
    """The eviction read the Spot's lanes as empty, then sealed it: a send admitted in
    between was discarded by the close (``messages_discarded_spot_closed``). The test holds
    the directory lock while the eviction runs, and sends: the Spot is not idle then, and
    the send is handled."""
    node = make_node(build_app(), idle_timeout=10.0)
    client = node.client()
    client.spots.get_or_create("room", "t.ar.room").wait(WAIT)
    node.wait_idle(WAIT)
    rt = node._runtime
    clock.advance(3.0)  # the sweep sees it first (idle since now)
    node.wait_idle(WAIT)
    lock = rt.directory.lock
    lock.acquire()
    try:
        clock.advance(12.0)  # the next sweep finds it idle, and stops at the lock
        deadline = time.monotonic() + WAIT
        while not _blocked_in({"_evict", "close_spot"}, "infra"):
            assert time.monotonic() < deadline, "the sweep never came to the Spot"
            time.sleep(0.001)
        client.send_to_spot("room", Bump()).wait(WAIT)  # admitted: the Spot is READY
    finally:
        lock.release()
    node.wait_idle(WAIT)
    assert BUMPS == ["room"]
    assert not node.counters().get("messages_discarded_spot_closed")


def test_a_call_that_activates_an_instance_spot_whose_constructor_raises_gets_handler_error(
    make_node,
):
    """A probe: the call that cold-activated an Instance Spot whose constructor raised got
    ``NotFound: spot 'bad' failed to activate``, the exception's type and message lost. A
    lifecycle callback that raises fails the create it belongs to with ``HandlerError``
    (errors.md), and the first message is that create: its caller hears what raised."""
    app = zlink.App("bad-instance")

    @app.instance_spot("t.ar.bad")
    class Bad(zlink.InstanceSpot):
        def __init__(self, context: zlink.SpotContext) -> None:
            raise RuntimeError("no database")

        @zlink.handler
        def ping(self, req: Ping) -> str:
            return "never"

    node = make_node(app)
    with pytest.raises(zlink.HandlerError) as failed:
        node.client().request_to_spot("bad", Ping()).instance_spot().wait(WAIT)
    assert failed.value.remote_type == "RuntimeError"
    assert "no database" in failed.value.remote_message
    assert node.counters().get("lifecycle_errors_constructor") == 1


def _late_request(monkeypatch: pytest.MonkeyPatch, client: Any, target: str, **kw: Any) -> Any:
    """A request made on a thread of its own that stops once its job is made (it found the
    Spot, past its state check), before it is put: ``(resume, thread, outcome)``."""
    import zlink.runtime.runtime as runtime_module

    made, resume, outcome = threading.Event(), threading.Event(), []
    job_class = runtime_module.MessageJob

    class _Paused(job_class):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if threading.current_thread().name == "late-caller":
                made.set()
                assert resume.wait(WAIT)

    monkeypatch.setattr(runtime_module, "MessageJob", _Paused)

    def call() -> None:
        ask = client.request_to_spot(target, Ping()).timeout(WAIT)
        if kw.get("instance"):
            ask = ask.instance_spot()
        outcome.append(_outcome(lambda: ask.wait(WAIT)))

    caller = threading.Thread(target=call, name="late-caller")
    caller.start()
    assert made.wait(WAIT)
    return resume, caller, outcome


def test_a_call_put_after_a_close_ended_never_runs_on_the_closed_spot(make_node, monkeypatch):
    """A review: a close set CLOSING, and its end drained the lanes, but admission stayed
    open: a request that had found the Spot READY and was put after the close ended ran
    on the closed instance, after ``on_closing``. Admission closes with the forget."""
    node = make_node(build_app())
    client = node.client()
    ref = client.spots.get_or_create("room", "t.ar.room").wait(WAIT).spot_ref
    resume, caller, outcome = _late_request(monkeypatch, client, "room")
    assert client.spots.close(ref)
    assert node.wait_idle(WAIT) and "room" not in node._runtime.spots
    resume.set()
    caller.join(WAIT)
    assert isinstance(outcome[0], zlink.NotFound), repr(outcome[0])


def test_a_call_put_after_an_activation_failed_never_runs_on_the_failed_spot(
    make_node, monkeypatch
):
    """A review: an Instance Spot whose ``on_initialize`` raised was forgotten and its lanes
    drained, admission open: a request that had found it activating and was put after ran
    its handler on the half-made instance. Admission closes with the forget."""
    app = zlink.App("failing-instance")
    failing, go = threading.Event(), threading.Event()

    @app.instance_spot("t.ar.failing")
    class Failing(zlink.InstanceSpot):
        def on_initialize(self) -> None:
            failing.set()
            assert go.wait(WAIT)
            raise RuntimeError("init failed")

        @zlink.handler
        def ping(self, req: Ping) -> str:
            return "ran on a Spot whose on_initialize raised"

    node = make_node(app)
    client = node.client()
    first = client.request_to_spot("bad", Ping()).instance_spot().timeout(WAIT).future()
    assert failing.wait(WAIT)
    resume, caller, outcome = _late_request(monkeypatch, client, "bad", instance=True)
    go.set()
    with pytest.raises(zlink.HandlerError):
        first.result(WAIT)
    assert node.wait_idle(WAIT) and "bad" not in node._runtime.spots
    resume.set()  # (made again, it activates anew, and fails as the first did)
    caller.join(WAIT)
    assert isinstance(outcome[0], zlink.HandlerError), repr(outcome[0])
