"""The engine alone (zlink.executor imports nothing else of zlink): lanes, gates, infra."""

from __future__ import annotations

import ast
import pathlib
import threading
from collections.abc import Callable

import pytest

import zlink.executor as ex
from zlink.executor import Admission
from zlink.executor.lanes import APPLICATION, LIFECYCLE, LaneLimits, OwnerLanes
from zlink.testing import ManualClock

WAIT = 5.0


def _lanes(streak: int = 8) -> OwnerLanes:
    return OwnerLanes(LaneLimits(lifecycle_streak=streak))


def test_lifecycle_goes_first_and_an_empty_lifecycle_lane_resets_the_streak():
    lanes = _lanes()
    lanes.put_app("a1", 0)
    lanes.put_life("l1", 0)
    assert lanes.take() == "l1" and lanes.streak == 1
    assert lanes.take() == "a1" and lanes.streak == 0 and not lanes.debt


def test_the_cap_marks_a_debt_that_one_application_turn_settles():
    lanes = _lanes(streak=3)
    for i in range(5):
        lanes.put_life(f"l{i}", 0)
    lanes.put_app("a", 0)
    assert [lanes.take() for _ in range(3)] == ["l0", "l1", "l2"]
    assert lanes.debt
    assert lanes.take() == "a"  # the owed application turn
    assert not lanes.debt and lanes.streak == 0
    assert lanes.take() == "l3"


def test_a_debt_without_application_work_keeps_running_lifecycle():
    lanes = _lanes(streak=2)
    for i in range(4):
        lanes.put_life(f"l{i}", 0)
    assert [lanes.take() for _ in range(4)] == ["l0", "l1", "l2", "l3"]
    assert lanes.debt  # kept: no application work, so no starvation either
    lanes.put_app("a", 0)
    lanes.put_life("l4", 0)
    assert lanes.take() == "a"


def test_moving_discards_debt_and_streak_together():
    lanes = _lanes(streak=1)
    lanes.put_life("l", 0)
    lanes.take()
    assert lanes.debt and lanes.streak == 1
    lanes.forget()
    assert not lanes.debt and lanes.streak == 0


def test_the_two_lanes_do_not_share_reservations():
    lanes = OwnerLanes(LaneLimits(app_items=1, life_items=1))
    assert lanes.put_app("a", 0) is Admission.ADMITTED
    assert lanes.put_app("b", 0) != 0  # application full...
    assert lanes.put_life("l", 0) is Admission.ADMITTED  # ...lifecycle still admits
    assert lanes.reserved() == (1, 256, 1, 0)
    lanes.release(APPLICATION, 0)
    lanes.release(LIFECYCLE, 0)
    assert lanes.reserved() == (0, 0, 0, 0)


def test_the_infrastructure_thread_fires_deadlines_by_the_injected_clock():
    clock = ManualClock()
    infra = ex.InfraExecutor(clock)
    infra.start()
    fired = threading.Event()
    handle = infra.call_later(10, fired.set)
    cancelled = infra.call_later(5, lambda: (_ for _ in ()).throw(AssertionError("cancelled")))
    cancelled.cancel()
    clock.advance(9.9)
    assert infra.wait_quiet(WAIT)
    assert not fired.is_set()
    clock.advance(0.1)
    assert fired.wait(WAIT)
    assert not handle.cancelled
    infra.stop()


def test_a_stopped_executor_is_quiet_whatever_falls_due_or_comes_after():
    """Found by review: a node's lease thread, stopped at shutdown, still had its next
    renewal on the heap; the manual clock's jump moved it to the ready queue, where no thread
    would ever run it, so ``busy`` stayed true and the stopped node's ``wait_idle`` timed
    out. A stopped executor holds no work: ``busy`` is false and ``wait_quiet`` returns."""
    clock = ManualClock()
    infra = ex.InfraExecutor(clock)
    infra.start()
    infra.call_later(1, lambda: None)
    infra.stop()
    clock.advance(2)  # due after the stop
    infra.submit(lambda: None)  # and a task after it
    assert not infra.busy
    assert infra.wait_quiet(0.5)


def test_a_second_stop_while_the_first_joins_leaves_the_executor_busy_until_it_ends():
    """Found by review: a second ``stop()`` while the first one's join had timed out (a long
    task) marked the executor stopped at once, so ``busy`` and ``wait_quiet`` said it held
    no work while a task still ran and another waited."""
    infra = ex.InfraExecutor(ManualClock())
    infra.start()
    running, release = threading.Event(), threading.Event()
    infra.submit(lambda: (running.set(), release.wait(WAIT)))
    assert running.wait(WAIT)
    infra.submit(lambda: None)
    try:
        infra.stop(0.05)  # the join times out behind the running task
        infra.stop(0.05)
        assert infra.busy and not infra.wait_quiet(0)
    finally:
        release.set()
    infra.stop(WAIT)
    assert not infra.alive and not infra.busy and infra.wait_quiet(0)


def test_stalled_for_times_the_task_running_not_the_batch():
    """Found by review: two tasks of 2.4 s each, taken in one batch, read as one stall of
    4.8 s, and a node withheld its lease renewals (a stall of one task past a lease is what
    withholds them: python-api §10 "Failure")."""
    clock = ManualClock()
    infra = ex.InfraExecutor(clock)
    running = [threading.Event(), threading.Event()]
    release = [threading.Event(), threading.Event()]

    def task(i: int) -> None:
        running[i].set()
        assert release[i].wait(WAIT)

    infra.submit(task, 0)
    infra.submit(task, 1)  # (queued before the thread starts: one batch)
    infra.start()
    try:
        assert running[0].wait(WAIT)
        clock.advance(2.4)
        assert infra.stalled_for() == pytest.approx(2.4)
        release[0].set()
        assert running[1].wait(WAIT)
        clock.advance(2.4)
        assert infra.stalled_for() == pytest.approx(2.4)
        release[1].set()
        assert infra.wait_quiet(WAIT)
        assert infra.stalled_for() == 0.0
    finally:
        release[0].set()
        release[1].set()
        infra.stop()


def test_a_deadline_cancelled_after_it_fired_does_not_hide_live_ones():
    """Found by review: cancelling a handle that had already fired counted it as a dead
    heap entry, so ``deadlines()`` (the status's ``infrastructure_deadlines``) read 0 with
    200 live deadlines after 500 requests had timed out, and stayed wrong."""
    clock = ManualClock()
    infra = ex.InfraExecutor(clock)
    infra.start()
    try:
        fired = [infra.call_later(1, lambda: None) for _ in range(500)]
        clock.advance(1)
        assert infra.wait_quiet(WAIT)
        for handle in fired:  # (a reply's path cancels its timer, fired or not)
            handle.cancel()
        live = [infra.call_later(60, lambda: None) for _ in range(200)]
        assert infra.deadlines() == 200
        for handle in live[:50]:
            handle.cancel()
        assert infra.deadlines() == 150
    finally:
        infra.stop()


def test_the_infrastructure_thread_progresses_while_every_worker_is_blocked():
    pool = ex.WorkerPool(2)
    pool.start()
    infra = ex.InfraExecutor(ex.MonotonicClock())
    infra.start()
    release = threading.Event()
    started = threading.Barrier(3)

    def block() -> None:
        started.wait(WAIT)
        release.wait(WAIT)

    pool.submit(block)
    pool.submit(block)
    started.wait(WAIT)  # both application workers are now stuck
    done = threading.Event()
    infra.submit(done.set)
    assert done.wait(WAIT)
    release.set()
    pool.wait_idle(WAIT)
    pool.shutdown()
    infra.stop()


def test_a_gate_hands_off_between_threads_and_keeps_no_thread_local_turn_state():
    pool = ex.WorkerPool(2)
    pool.start()
    gate = ex.Gate(pool, ManualClock(), 0.010)
    owner = ex.Owner(OwnerLanes(LaneLimits()), gate, "o", claim_on_yield=False)
    threads: set[str] = set()
    done = threading.Event()
    n = 2000

    for i in range(n):

        def body(i: int = i) -> None:
            threads.add(threading.current_thread().name)
            turn = ex.current_turn()
            assert turn is not None and turn.owner is owner
            if i == n - 1:
                done.set()

        owner.put_app(ex.CallJob(body))
        if i % 50 == 0:  # let the gate go idle now and then, so it is rescheduled
            pool.wait_idle(WAIT)
    assert done.wait(WAIT)
    pool.shutdown()
    assert ex.current_turn() is None  # outside any turn


def test_the_executor_imports_nothing_else_from_zlink():
    root = pathlib.Path(ex.__file__).parent
    for path in root.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert node.level <= 1, f"{path.name} reaches above the executor"
                assert not (node.module or "").startswith("zlink"), path.name
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("zlink") for a in node.names), path.name


def test_a_failing_hold_continuation_does_not_kill_the_gate(caplog):
    pool = ex.WorkerPool(1)
    pool.start()
    gate = ex.Gate(pool, ManualClock(), 0.010, "g")
    owner = ex.Owner(OwnerLanes(LaneLimits()), gate, "o", claim_on_yield=False)
    other = ex.Owner(OwnerLanes(LaneLimits()), gate, "p", claim_on_yield=False)

    def boom() -> None:
        raise RuntimeError("continuation failed")

    owner.put_app(ex.CallJob(lambda: owner.hold(boom)))
    assert pool.wait_idle(WAIT)
    ran = threading.Event()
    other.put_app(ex.CallJob(ran.set))  # the same gate still runs other owners
    assert ran.wait(WAIT)
    pool.shutdown()
    assert "continuation of a hold" in caplog.text


class _Light(ex.Job):
    """A light job (``Job.light``): a plain call; post-processing only when it failed or
    registered a Defer() barrier."""

    __slots__ = ("fn", "log")
    light = True

    def __init__(self, fn, log: list[str]) -> None:
        super().__init__(10)
        self.fn = fn
        self.log = log

    def invoke(self) -> None:
        self.fn()

    def finish(self, turn: ex.Turn) -> None:
        self.log.append(f"finish:{type(turn.error).__name__}:{turn.barriers is not None}")
        turn.barriers = ("closed",)


def _held_gate(clock: ManualClock | None = None) -> tuple[ex.Gate, list[ex.Owner]]:
    pool = ex.WorkerPool(1)  # never started: the test runs the gate on its own thread
    gate = ex.Gate(pool, clock or ManualClock(), 0.010, "g")
    owners = [ex.Owner(OwnerLanes(LaneLimits()), gate, n, claim_on_yield=False) for n in "AB"]
    assert gate._flag.acquire(False)  # held while the lanes fill, as a worker would hold it
    return gate, owners


def test_owners_sharing_a_gate_alternate_turn_by_turn_and_one_alone_runs_back_to_back():
    """§2/§7: the ring is round robin between the owners of a gate, one turn each, and the lane
    rule holds at every turn boundary, also when an owner runs alone."""
    gate, (a, b) = _held_gate()
    order: list[str] = []

    def job(name: str, light: bool) -> ex.Job:
        return (
            _Light(lambda: order.append(name), [])
            if light
            else ex.CallJob(lambda: order.append(name))
        )

    for i in range(3):
        a.put_app(job(f"a{i}", light=i != 1))
        b.put_app(job(f"b{i}", light=i == 1))
    gate._run_batch()
    assert order == ["a0", "b0", "a1", "b1", "a2", "b2"]
    order.clear()

    def first() -> None:  # lifecycle work that arrives while A runs alone goes next (§7)
        order.append("a3")
        a.put_life(ex.CallJob(lambda: order.append("life"), LIFECYCLE))

    assert gate._flag.acquire(False)
    a.put_app(_Light(first, []))
    a.put_app(job("a4", light=True))
    gate._run_batch()
    assert order == ["a3", "life", "a4"]
    assert a.lanes.reserved() == (0, 0, 0, 0) and b.lanes.reserved() == (0, 0, 0, 0)
    assert not gate.busy and not a._flag.locked()  # idle: the gate and the owner are free


def test_light_jobs_run_back_to_back_only_while_the_general_checks_would_pick_the_next():
    """§2/§7: an owner alone runs its queued light jobs one after another, but an owner that
    becomes ready meanwhile gets the next turn (round robin), a job that is not light goes
    through the general path in queue order, and a hold stops the owner at once."""
    gate, (a, b) = _held_gate()
    order: list[str] = []

    def note(name: str) -> Callable[[], None]:
        return lambda: order.append(name)

    def wakes_b() -> None:
        order.append("a0")
        b.put_app(_Light(note("b0"), []))  # B is ready now: it goes before a1

    a.put_app(_Light(wakes_b, []))
    a.put_app(_Light(note("a1"), []))
    a.put_app(ex.CallJob(note("a2")))  # not light: the general path, still in order
    a.put_app(_Light(note("a3"), []))
    gate._run_batch()
    assert order == ["a0", "b0", "a1", "a2", "a3"]

    order.clear()
    assert gate._flag.acquire(False)
    resumed: list[str] = []

    def holds() -> None:
        order.append("h")
        a.hold(lambda: resumed.append("held"))  # e.g. a Join taking the owner (§5)

    a.put_app(_Light(holds, []))
    a.put_app(_Light(note("after"), []))
    gate._run_batch()
    assert order == ["h"] and resumed == ["held"]  # the next light job waits for the unhold
    assert gate._flag.acquire(False)
    a.unhold()
    gate._run_batch()
    assert order == ["h", "after"]
    assert a.lanes.reserved() == (0, 0, 0, 0) and b.lanes.reserved() == (0, 0, 0, 0)


def test_a_light_job_is_a_turn_and_only_a_failed_or_deferring_one_is_post_processed():
    gate, (a, _) = _held_gate()
    log: list[str] = []
    turns: list[ex.Turn] = []

    def plain() -> None:
        turn = ex.current_turn()
        assert turn is not None and turn.owner is a and turn.barriers is None
        turns.append(turn)

    def fails() -> None:
        raise ValueError("alone")

    def defers() -> None:
        turn = ex.current_turn()
        assert turn is not None
        turn.barriers = [lambda: None]  # what Defer() registers (§5)

    for fn in (plain, fails, defers, plain):
        a.put_app(_Light(fn, log))
    assert a.lanes.reserved()[:2] == (4, 4 * (10 + 256))
    gate._run_batch()
    assert log == ["finish:ValueError:False", "finish:NoneType:True"]
    assert len(turns) == 2 and turns[0] is not turns[1]  # a turn of its own each
    assert all(t.barriers is not None for t in turns)  # each scope closed
    assert a.lanes.reserved() == (0, 0, 0, 0)  # every reservation went back
    assert ex.current_turn() is None


def test_an_owner_running_alone_still_hands_the_gate_back_when_its_budget_is_spent():
    """§9: the budget is checked after every turn, also between turns of one owner."""
    clock = ManualClock()
    gate, (a, _) = _held_gate(clock)
    order: list[str] = []
    submitted: list[object] = []
    gate._pool.submit = submitted.append  # type: ignore[method-assign]
    a.put_app(_Light(lambda: (order.append("slow"), clock.advance(0.011)), []))
    a.put_app(_Light(lambda: order.append("next"), []))
    gate._run_batch()
    assert order == ["slow"] and submitted == [gate._run]  # back of the run queue, flag kept
    assert gate.busy
    gate._run_batch()
    assert order == ["slow", "next"] and not gate.busy


def test_the_pool_counts_busy_workers_and_pending_items_exactly():
    pool = ex.WorkerPool(2)
    pool.start()
    started, release = threading.Event(), threading.Event()

    def blocked() -> None:
        started.set()
        assert release.wait(WAIT)

    pool.submit(blocked)
    assert started.wait(WAIT)
    assert pool.busy == 1 and pool.pending == 1  # running, not yet finished
    assert not pool.wait_idle(0.01)  # a real wait with a short timeout: it is still busy
    assert pool.wait_idle(WAIT, busy=1)  # everything but the blocked item is done
    release.set()
    assert pool.wait_idle(WAIT)
    assert pool.busy == 0 and pool.pending == 0
    pool.shutdown()


def test_run_turns_makes_each_call_a_current_turn_and_puts_the_callers_back():
    """§5/§6: every call of a batch is a turn of its own while it runs; the post-processing of
    a failed one, a halt and the end of the run all see the caller's turn again."""
    from zlink.executor.turn import CURRENT_TURN

    class Halt:
        stopping = False

    halt, seen, after_saw = Halt(), [], []
    outer = object()
    token = CURRENT_TURN.set(outer)  # type: ignore[arg-type]
    try:

        def call(first: object, arg: str) -> None:
            turn = ex.current_turn()
            seen.append((arg, turn))
            if arg == "boom":
                raise ValueError(arg)
            if arg == "halt":
                halt.stopping = True

        def after(turn: ex.Turn) -> None:
            after_saw.append((type(turn.error).__name__, ex.current_turn()))

        args = ["a", "boom", "b", "halt", "never"]
        calls = iter([(call, a) for a in args])
        assert ex.run_turns(ex.CallJob(lambda: None), None, calls, None, after, halt) is True
        assert [a for a, _ in seen] == ["a", "boom", "b", "halt"]  # halted before "never"
        assert list(calls) == []  # "never" was taken, not run: the caller counts it
        turns = [t for _, t in seen]
        assert len({id(t) for t in turns}) == 4 and outer not in turns  # a turn each
        assert after_saw == [("ValueError", outer)]  # post-processing as the caller's turn
        assert ex.current_turn() is outer
        halt.stopping = False
        halted = ex.run_turns(ex.CallJob(lambda: None), None, [(call, "c")], None, after, halt)
        assert halted is False  # every call ran
    finally:
        CURRENT_TURN.reset(token)


def test_a_daemon_pool_is_bounded_starts_threads_on_demand_and_survives_a_failing_call(caplog):
    pool, one = ex.DaemonPool(2, "t-pool"), ex.DaemonPool(1, "t-pool-one")
    assert pool.threads == 0
    gate, done, after = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        assert gate.wait(WAIT)

    def boom() -> None:
        raise ValueError("boom")

    try:
        pool.submit(hold)
        pool.submit(hold)
        pool.submit(done.set)  # both threads are busy: it waits for one, no third thread
        assert pool.threads == 2
        gate.set()
        assert done.wait(WAIT)
        assert pool.threads == 2
        one.submit(boom)
        one.submit(after.set)  # the same thread, after the failing call: it went on
        assert after.wait(WAIT)
        assert one.threads == 1
        assert "a call on pool t-pool-one failed" in caplog.text
        assert all(t.daemon for t in threading.enumerate() if t.name.startswith("t-pool"))
    finally:
        gate.set()
        pool.shutdown()
        one.shutdown()


def test_a_daemon_pool_shutdown_returns_what_never_started_and_joins_nothing():
    pool = ex.DaemonPool(1, "t-pool-stop")
    gate, started = threading.Event(), threading.Event()
    ran: list[str] = []

    def hold() -> None:
        started.set()
        assert gate.wait(WAIT)

    def queued() -> None:
        ran.append("queued")

    try:
        pool.submit(hold)
        assert started.wait(WAIT)
        pool.submit(queued)
        assert pool.shutdown() == [queued]  # returns at once: the running call goes on
        with pytest.raises(RuntimeError):
            pool.submit(queued)
        assert pool.threads == 1
    finally:
        gate.set()
    assert ran == []


def test_close_if_idle_tries_again_when_a_consumer_pops_as_it_looks():
    """CI on 3.13t: ``close_if_idle`` iterated the application lane under the producers'
    lock, but a consumer pops without it: "deque mutated during iteration" killed the idle
    sweep. It copies the lane, tries again a few times, and else says "not idle" for now."""
    from collections import deque

    class _Popped(deque):  # type: ignore[type-arg]
        """A lane whose first iterations meet a pop (as a consumer's would)."""

        fails = 2

        def __iter__(self):  # type: ignore[no-untyped-def]
            if _Popped.fails:
                _Popped.fails -= 1
                raise RuntimeError("deque mutated during iteration")
            return super().__iter__()

    lanes = OwnerLanes(LaneLimits())
    assert lanes.put_app("tick", 0) is Admission.ADMITTED
    try:
        lanes.app = _Popped(lanes.app or ())
    except TypeError:  # a compiled lane takes a deque only: nothing to test there
        pytest.skip("the lane's attribute is typed in the compiled module")
    assert lanes.close_if_idle(lambda item: item == "tick")  # the third copy
    assert lanes.closed
    lanes2 = OwnerLanes(LaneLimits())
    assert lanes2.put_app("msg", 0) is Admission.ADMITTED
    _Popped.fails = 9
    lanes2.app = _Popped(lanes2.app or ())
    assert not lanes2.close_if_idle(lambda item: True)  # never a copy: not idle for now
    assert not lanes2.closed


def test_the_lanes_count_their_bounded_waiters_as_they_come_and_go():
    """Past ``LaneLimits.waiters`` waiters, every new one summed the ``bounded`` flag of every
    waiter before it under the put lock (quadratic, with thousands of waits from peers). The
    lanes count them as they join and leave now (served, withdrawn, handed on, ended): a
    caller here is refused only while that many of them really wait, whatever waits from
    peers queue too."""
    lanes = OwnerLanes(LaneLimits(app_items=1, waiters=2))
    assert lanes.put_app("x", 0) == Admission.ADMITTED  # the lane is full from now on

    def waiter(bounded: bool = True) -> ex.RoomWaiter:
        return ex.RoomWaiter("w", 0, 1, lambda _verdict: None, bounded=bounded)

    for _ in range(50):  # from peers: never refused, never counted
        assert lanes.wait_room(waiter(bounded=False)) == Admission.WAITING
    mine = [waiter(), waiter()]
    assert [lanes.wait_room(w) for w in mine] == [Admission.WAITING] * 2
    assert lanes.wait_room(waiter()) == Admission.FULL_COUNT  # 2 callers here wait already
    assert lanes.cancel_wait(mine[0])
    third = waiter()
    assert lanes.wait_room(third) == Admission.WAITING  # one left: room for one more
    assert lanes.wait_room(waiter()) == Admission.FULL_COUNT
    handed = lanes.take_waiters()  # an owner replaced: every waiter handed on
    assert len(handed) == 52
    assert [lanes.wait_room(w) for w in (waiter(), waiter())] == [Admission.WAITING] * 2
    lanes.end_waits()  # a seal
    lanes.closed = False
    assert [lanes.wait_room(w) for w in (waiter(), waiter())] == [Admission.WAITING] * 2
    lanes.release(APPLICATION, 0)  # room: the first is served, and leaves the count
    assert lanes.wait_room(waiter()) == Admission.WAITING


def test_a_deadline_cancelled_as_it_comes_due_does_not_fail_its_canceller():
    """CI on 3.13t: ``DeadlineHandle.cancel`` read ``_owner`` twice; the infrastructure thread
    took the handle off the heap (``_owner = None``) between the two reads, and the cancelling
    thread failed with ``AttributeError`` (a create's completion never reached its caller)."""
    from zlink.executor.infra import DeadlineHandle, InfraExecutor

    class TakenBetweenReads(DeadlineHandle):
        """A handle the infrastructure thread takes off the heap right after the first read
        of its owner (what a free-threaded interleaving did)."""

        def __init__(self, owner: InfraExecutor) -> None:
            self.reads = 0
            super().__init__(1.0, lambda: None, (), owner)

        @property  # type: ignore[override]
        def _owner(self) -> InfraExecutor | None:
            self.reads += 1
            return self.__dict__["owner"] if self.reads == 1 else None

        @_owner.setter
        def _owner(self, owner: InfraExecutor | None) -> None:
            self.reads = 0
            self.__dict__["owner"] = owner

    infra = InfraExecutor(ManualClock())
    handle = TakenBetweenReads(infra)
    handle.cancel()  # before the fix: AttributeError: 'NoneType' ... '_cancelled_one'
    assert handle.cancelled and handle.fn is not None


def test_a_stop_that_finds_the_thread_ending_waits_for_it_to_end():
    """3.13t CI: a stop that found the executor already ``stopped`` (its thread had said so,
    under the lock, and was on its way out) returned at once with the thread still alive, so
    ``alive`` read true after ``stop()`` returned. It joins the thread as any stop does."""
    ended, gate = threading.Event(), threading.Event()

    class _SlowToEnd(ex.InfraExecutor):
        def _next_batch(self):  # type: ignore[no-untyped-def]
            batch = super()._next_batch()
            if batch is None:  # "stopped" is said: the thread lingers before it ends
                ended.set()
                assert gate.wait(WAIT)
            return batch

    infra = _SlowToEnd(ManualClock())
    infra.start()
    infra.stop(0.05)  # its join times out: the thread lingers
    assert ended.wait(WAIT)
    timer = threading.Timer(0.1, gate.set)
    timer.start()
    try:
        infra.stop(WAIT)
        assert not infra.alive
    finally:
        gate.set()
        timer.cancel()
