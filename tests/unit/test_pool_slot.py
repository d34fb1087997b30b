"""The worker pool's LIFO slot (issue "Performance": chains of messages; execution-model §10,
§12): a gate made ready by a running item runs next on the same worker, what the slot held
before goes to the shared queue, an item left in a slot is taken by an idle worker, and chains
never starve the shared queue. And how idle workers park and are woken (no wake-up lost)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

import pytest

from zlink.executor import WorkerPool
from zlink.executor import pool as pool_module

pytestmark = pytest.mark.timeout(30)


def _started(workers: int) -> WorkerPool:
    pool = WorkerPool(workers)
    pool.start()
    return pool


def test_an_item_made_ready_by_a_running_item_runs_next_ahead_of_the_shared_queue():
    pool = _started(1)
    order: list[str] = []
    done = threading.Event()

    def first() -> None:
        pool.submit(lambda: order.append("shared"))  # queued first, at the back
        pool.submit_next(lambda: order.append("next"))
        pool.submit(done.set)  # behind "shared": set once both have run

    pool.submit(first)
    assert done.wait(5)
    assert order == ["next", "shared"]
    pool.shutdown()


def test_a_second_item_moves_the_first_to_the_shared_queue_and_both_run_once():
    pool = _started(1)
    order: list[str] = []
    done = threading.Event()

    def first() -> None:
        pool.submit(lambda: order.append("shared"))
        pool.submit_next(lambda: order.append("bumped"))  # goes to the back of the queue
        pool.submit_next(lambda: order.append("next"))
        pool.submit(done.set)

    pool.submit(first)
    assert done.wait(5)
    assert order == ["next", "shared", "bumped"]
    assert pool.wait_idle(5)
    assert pool.pending == 0
    pool.shutdown()


def test_off_the_pool_submit_next_is_a_plain_submit():
    pool = _started(1)
    ran = threading.Event()
    pool.submit_next(ran.set)  # from the test's thread: no slot
    assert ran.wait(5)
    pool.shutdown()


def test_an_item_left_in_a_slot_behind_a_long_turn_is_taken_by_an_idle_worker():
    pool = _started(2)
    ran_on: list[str] = []
    stolen = threading.Event()
    blocker_thread: list[str] = []

    def slotted() -> None:
        ran_on.append(threading.current_thread().name)
        stolen.set()

    def long_turn() -> None:
        blocker_thread.append(threading.current_thread().name)
        pool.submit_next(slotted)
        # keeps its worker until the slotted item ran elsewhere: it never would on this one
        assert stolen.wait(10), "the item in this worker's slot was never taken"

    pool.submit(long_turn)
    assert stolen.wait(10)
    assert ran_on != blocker_thread
    assert pool.wait_idle(5)
    pool.shutdown()


def test_a_chain_of_slot_items_lets_the_shared_queue_in_after_a_bounded_streak():
    pool = _started(1)
    hops = [0]
    shared_ran_at: list[int] = []
    done = threading.Event()

    def hop() -> None:
        hops[0] += 1
        if hops[0] == 1:
            pool.submit(lambda: shared_ran_at.append(hops[0]))
        if hops[0] < 200:
            pool.submit_next(hop)
        else:
            done.set()

    pool.submit(hop)
    assert done.wait(10)
    assert shared_ran_at and shared_ran_at[0] <= pool_module._SLOT_STREAK + 1
    pool.shutdown()


def test_a_ping_pong_of_gates_keeps_to_one_worker_while_it_runs(monkeypatch):
    """Consecutive hops stay on the thread that made them ready: no hand-over per hop. (An
    idle worker may still take one over after a long pause; hops it takes are counted.)"""
    pool = _started(2)
    threads: list[str] = []
    done = threading.Event()

    def hop(n: int) -> Callable[[], None]:
        def run() -> None:
            threads.append(threading.current_thread().name)
            if n:
                pool.submit_next(hop(n - 1))
            else:
                done.set()

        return run

    pool.submit(hop(1000))
    assert done.wait(10)
    changes = sum(a != b for a, b in itertools.pairwise(threads))
    assert changes <= 10, f"{changes} hand-overs in 1,000 hops"
    pool.shutdown()


def test_no_wake_up_is_lost_when_only_submits_can_wake_a_worker(monkeypatch):
    """The parking protocol (``pool`` docstring, "Waking"): with the polls pushed out to a
    minute, only a submit wakes a parked worker. Bursts from several threads, onto workers
    that park between them, all run within seconds (a lost wake-up, or a searching count that
    leaks and so stops submits from waking anyone, leaves an item waiting a minute)."""
    monkeypatch.setattr(pool_module, "_POLL", 60.0)
    monkeypatch.setattr(pool_module, "_POLL_IDLE", 60.0)
    pool = _started(2)
    ran = itertools.count()
    lock = threading.Lock()
    seen = [0]

    def item() -> None:
        next(ran)
        with lock:
            seen[0] += 1

    try:

        def produce(n: int) -> None:
            for _ in range(n):
                pool.submit(item)

        for burst in range(200):
            producers = [threading.Thread(target=produce, args=(burst % 7 + 1,)) for _ in range(3)]
            for t in producers:
                t.start()
            for t in producers:
                t.join(5)
            assert pool.wait_idle(5), f"burst {burst}: an item waited for a wake-up"
        assert seen[0] == sum(3 * (b % 7 + 1) for b in range(200))
        assert next(ran) == seen[0]
    finally:
        pool.shutdown()


def test_a_submit_that_lands_while_a_worker_decides_to_park_is_not_lost(monkeypatch):
    """The window the re-check under ``_lock`` closes: a worker found nothing and, before it
    parks, a submit comes; the submit sees a searching worker and wakes nobody, so the worker
    must see the item itself (with the polls pushed out to a minute, nothing else would)."""
    monkeypatch.setattr(pool_module, "_POLL", 60.0)
    monkeypatch.setattr(pool_module, "_POLL_IDLE", 60.0)
    pool = WorkerPool(1)
    real = pool._steal
    armed = [True]
    done = threading.Event()

    def steal(
        index: int, seen: list[tuple[Callable[[], None] | None, int]]
    ) -> tuple[Callable[[], None] | None, bool]:
        if armed[0]:  # the first look found nothing: a submit lands now, from another thread
            armed[0] = False
            submitter = threading.Thread(target=pool.submit, args=(done.set,))
            submitter.start()
            submitter.join(5)
        return real(index, seen)

    pool._steal = steal  # type: ignore[method-assign]
    pool.start()
    try:
        assert done.wait(5)
    finally:
        pool.shutdown()


def test_workers_spin_only_without_the_gil_and_with_more_than_one_cpu(monkeypatch):
    """On one CPU a spinning worker would only take the time of the thread that has work."""
    monkeypatch.setattr(pool_module, "_gil_enabled", lambda: False)
    monkeypatch.setattr(pool_module, "_cpus", lambda: 1)
    assert WorkerPool(2)._spin == 0
    monkeypatch.setattr(pool_module, "_cpus", lambda: 2)
    assert WorkerPool(2)._spin == pool_module._SPIN > 0
    monkeypatch.setattr(pool_module, "_gil_enabled", lambda: True)  # the GIL is on (again)
    assert WorkerPool(2)._spin == 0
