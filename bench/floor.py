"""The floor: the least pure-Python code that does what a ZLink send must do per message.

``bench.split`` runs these beside ZLink and Pykka, to show how far any Python implementation of
the same contract could go, and so what a throughput target against Pykka asks of Python. None
of it is ZLink; it is what is left when every layer, every check of an unusual case and every
general path is taken away, and the per-message work of the contract is kept:

* **sending** (execution-model §7, §11; python-api §4): the call builder of the API shape,
  ``send_to_spot(id, msg).submit()`` (id check, a call object, the one-terminal rule), routing
  by id, the ready and stopping checks, the handler looked up by message type, the sender read
  from the current turn, the payload size (cached by identity, as ZLink does), the admission
  time, admission by count and bytes under the put lock (a reservation of payload + 256 bytes),
  the append and the owner's ready flag;
* **handling** (§2, §5, §7-§9): the lane choice (lifecycle first), a turn object made current
  for the handler (a ``ContextVar``, one ``set`` per turn), the handler call, its Defer()
  scope closed, the reservation returned at its end, and one clock read per turn for the
  budget.

``contract`` is the same without the API shape: a function call per send with the handler,
instance and size already known. ``batch`` admits 100 messages under one lock (their size
from one serializer call, as ZLink takes it) and runs each as a turn of its own.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, TypeAdapter

N = 1_000  # messages per round, as in bench.split
RETAINED = 256  # §7: the fixed retained cost of a work item
_CURRENT: contextvars.ContextVar[Any] = contextvars.ContextVar("floor_turn", default=None)
_CLOSED = object()


class _Turn:
    __slots__ = ("barriers", "job", "owner")
    barriers: object
    job: _Job
    owner: object


class _Job:
    __slots__ = ("at", "fn", "instance", "msg", "sender", "size")
    at: float
    fn: Callable[[Any, Any], None]
    instance: Any
    msg: Any
    sender: object
    size: int


class _Lanes:
    def __init__(self) -> None:
        self.app: deque[_Job] = deque()
        self.life: deque[_Job] = deque()
        self.put_lock = threading.Lock()
        self.ready = threading.Lock()
        self.closed = False
        self.n_in = self.b_in = self.n_out = self.b_out = 0

    def put(self, job: _Job, count: int = 1) -> bool:
        cost = job.size + RETAINED * count
        lock = self.put_lock
        lock.acquire()
        try:
            if self.closed or self.n_in - self.n_out + count > 1024:
                return False
            if self.b_in - self.b_out + cost > 64 << 20:
                return False
            self.n_in += count
            self.b_in += cost
            self.app.append(job)
        finally:
            lock.release()
        ready = self.ready
        if not ready.locked():
            ready.acquire(False)  # a worker would be scheduled here; the round holds it
        return True


class _Target:
    __slots__ = ("handlers", "instance", "lanes", "ready")
    handlers: dict[type, Callable[[Any, Any], None]]
    instance: Any
    lanes: _Lanes
    ready: bool


class _Runtime:
    def __init__(self) -> None:
        self.targets: dict[str, _Target] = {}
        self.stopping = False
        self.now = time.monotonic
        self.last: tuple[Any, int] = (None, 0)

    def size(self, msg: BaseModel) -> int:
        """The payload's JSON length, kept for the instance sent last (as ZLink keeps it)."""
        last = self.last
        if last[0] is msg:
            return last[1]
        size = len(msg.__pydantic_serializer__.to_json(msg))
        self.last = (msg, size)
        return size

    def send(self, call: _Call) -> None:
        target = self.targets.get(call.target)
        if target is None or not target.ready or self.stopping:
            raise LookupError(call.target)
        msg = call.msg
        fn = target.handlers.get(type(msg))
        if fn is None:
            raise TypeError(type(msg))
        turn = _CURRENT.get()
        job = _Job.__new__(_Job)
        job.fn, job.instance, job.msg = fn, target.instance, msg
        job.sender = turn.owner if turn is not None else None
        job.size = self.size(msg)
        job.at = self.now()
        if not target.lanes.put(job):
            raise OverflowError("the lane is full")


class _Call:
    __slots__ = ("_ended", "_options", "msg", "rt", "target")
    _ended: bool
    _options: set[str] | None
    msg: Any
    rt: _Runtime
    target: str

    def submit(self) -> None:
        if self._ended:
            raise RuntimeError("a call takes exactly one terminal")
        self._ended = True
        self.rt.send(self)


class _Client:
    def __init__(self, rt: _Runtime) -> None:
        self._rt = rt

    def send_to_spot(self, spot_id: str, msg: Any) -> _Call:
        if type(spot_id) is not str or not 0 < len(spot_id) <= 63:
            raise ValueError(spot_id)
        call = _Call.__new__(_Call)
        call.rt, call.target, call.msg = self._rt, spot_id, msg
        call._ended, call._options = False, None
        return call


def _drain(lanes: _Lanes, rt: _Runtime) -> None:
    """Turns until the lanes are empty: the part of a gate's loop every message needs (a
    handler that raises is left out: the floor's handler never does)."""
    app, life = lanes.app, lanes.life
    now = rt.now
    deadline = now() + 0.010
    new, set_current = _Turn.__new__, _CURRENT.set
    token = set_current(None)  # each turn replaces the value; one reset at the end
    while True:
        if life:
            job = life.popleft()
        elif app:
            job = app.popleft()
        else:
            break
        turn = new(_Turn)
        turn.job, turn.owner, turn.barriers = job, lanes, None
        set_current(turn)
        if not rt.stopping:
            job.fn(job.instance, job.msg)
        turn.barriers = _CLOSED
        lanes.n_out += 1
        lanes.b_out += job.size + RETAINED
        if now() >= deadline:
            deadline = now() + 0.010  # the budget: a worker would requeue the gate here
    _CURRENT.reset(token)
    lanes.ready.release()


def _drain_batches(lanes: _Lanes, rt: _Runtime) -> None:
    """Batch entries: one reservation for all, a turn per message (run_turns' part)."""
    app = lanes.app
    new, set_current = _Turn.__new__, _CURRENT.set
    token = set_current(None)
    while app:
        job = app.popleft()
        fn, instance = job.fn, job.instance
        for msg in job.msg:
            if rt.stopping:
                break
            turn = new(_Turn)
            turn.job, turn.owner, turn.barriers = job, lanes, None
            set_current(turn)
            fn(instance, msg)
            turn.barriers = _CLOSED
        lanes.n_out += len(job.msg)
        lanes.b_out += job.size + RETAINED * len(job.msg)
    _CURRENT.reset(token)
    lanes.ready.release()


def floor_side(
    msg: BaseModel, batch: list[BaseModel], handler: Callable[[Any, Any], None], instance: Any
) -> dict[str, Callable[[], float]]:
    """Timed rounds of ``N`` messages each, in seconds: ``contract send``, ``api send``,
    ``batch send`` (``batch``: one message type, ``N`` divisible by its length) and the
    matching ``* handle`` drains; ``msg`` is sent again and again, to ``handler(instance,
    msg)`` (the very handler the compared runtime calls, so that its body costs the same)."""
    rt = _Runtime()
    target = _Target()
    target.lanes, target.instance, target.ready = _Lanes(), instance, True
    tp = type(msg)
    target.handlers = {tp: handler}
    many = TypeAdapter(list[tp])  # type: ignore[valid-type]
    rt.targets["c"] = target
    client = _Client(rt)
    lanes = target.lanes
    size = rt.size(msg)

    def contract_send() -> float:
        now, put, fn = rt.now, lanes.put, handler
        t0 = time.perf_counter()
        for _ in range(N):
            job = _Job.__new__(_Job)
            job.fn, job.instance, job.msg, job.sender, job.size = fn, instance, msg, None, size
            job.at = now()
            put(job)
        return time.perf_counter() - t0

    def api_send() -> float:
        send = client.send_to_spot
        t0 = time.perf_counter()
        for _ in range(N):
            send("c", msg).submit()
        return time.perf_counter() - t0

    def batch_send() -> float:
        n = len(batch)
        t0 = time.perf_counter()
        for _ in range(N // n):
            msgs = list(batch)
            handlers = {t: target.handlers[t] for t in set(map(type, msgs))}
            job = _Job.__new__(_Job)
            job.fn, job.instance, job.msg = handlers[tp], target.instance, msgs
            job.sender, job.at = None, rt.now()
            job.size = len(many.dump_json(msgs)) - n - 1  # the items of a JSON list
            lanes.put(job, n)
        return time.perf_counter() - t0

    def handle() -> float:
        t0 = time.perf_counter()
        _drain(lanes, rt)
        return time.perf_counter() - t0

    def batch_handle() -> float:
        t0 = time.perf_counter()
        _drain_batches(lanes, rt)
        return time.perf_counter() - t0

    return {
        "contract send": contract_send, "contract handle": handle,
        "api send": api_send, "api handle": handle,
        "batch send": batch_send, "batch handle": batch_handle,
    }  # fmt: skip
