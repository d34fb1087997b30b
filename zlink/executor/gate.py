"""The execution right and the serial objects that share it (execution-model §2, §3, §6-§9, §11).

An :class:`Owner` is one serial execution object (a Spot's own queue, an Actor's queue, a timer)
with its two lanes. A :class:`Gate` is one execution right; in SpotWide many owners share one
gate, in PerActor each has its own. A gate keeps a *ready ring* of owners that have work.

Guarantees / assumes:
* ``Gate._flag`` is the execution right. Taking it is one atomic step (``Lock.acquire(False)``);
  whoever takes it puts the gate on the pool's run queue once. Only its holder steps turns, takes
  from lanes, pops the ring or writes lane release counters. So two turns of one gate never
  overlap (§2) and the dequeue side needs no lock (§11).
* ``Owner._flag`` says "this owner is in its gate's ring, running, or held". It is taken in one
  atomic step by whoever makes the owner ready, so an owner is in a ring at most once.
* A held owner (a member Actor across a Yield keeps its claim, §3; an Actor during Join, §5) is
  not put back in the ring; only a resume record can make it ready until it is unheld.
* Post-processing (``Job.finish``: reply, Join barriers, reservation return) runs before the gate
  moves on or is released (§8). A full queue never runs work inline; a turn never re-enters (§6).
* The batch budget is time on the injected clock, checked only between turns (§9); on expiry
  the gate goes to the back of the run queue still holding its flag.
* The ring is round robin, one turn per owner (§2). An owner alone in it runs its turns back to
  back without leaving and re-entering it; the lane rule (§7) and the budget are still applied
  after every turn. A ``light`` job (see ``Job``) runs as a turn without ``start()``/``finish()``.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any

from .clock import Clock
from .lanes import ADMITTED, APPLICATION, Admission, Entries, OwnerLanes
from .pool import WorkerPool
from .turn import CLOSED, CURRENT_TURN, DONE, KEEP_GATE, RELEASE_GATE, Job, Step, Turn

LIGHT = Step.LIGHT
_new_turn = Turn.__new__
_get_current, _set_current, _reset_current = CURRENT_TURN.get, CURRENT_TURN.set, CURRENT_TURN.reset

_log = logging.getLogger("zlink.gate")


class _Resume:
    """A Yield continuation waiting for its gate: a new turn step, not a new message (§3)."""

    __slots__ = ("error", "turn", "value")
    light = False  # never run as a light job (it may wait in the application lane)

    def __init__(self, turn: Turn, value: Any, error: BaseException | None) -> None:
        self.turn = turn
        self.value = value
        self.error = error


class Owner:
    """One serial execution object: its lanes, its current gate and its scheduling flag."""

    __slots__ = (
        "_after_hold",
        "_flag",
        "_held",
        "_resume",
        "claim_on_yield",
        "gate",
        "lanes",
        "name",
        "ref",
    )  # fmt: skip

    def __init__(
        self, lanes: OwnerLanes, gate: Gate, name: str, claim_on_yield: bool, held: bool = False
    ) -> None:
        self.lanes = lanes
        self.gate = gate
        self.name = name
        self.claim_on_yield = claim_on_yield  # member Actors keep their claim across Yield (§3)
        # Taken by whoever makes the owner ready. On the put side it is tried only when
        # ``locked()`` says it is free: a held flag is the common case under load, and a
        # failed ``acquire(False)`` costs ~100 ns (its arguments are parsed) against ~7 ns.
        # Skipping it is the same as failing it: the holder re-checks the lanes after
        # releasing the flag (``_settle_empty``), and sees what was queued before.
        self._flag = threading.Lock()
        self._held = held  # born held: work queues but does not run until unhold()
        if held:
            self._flag.acquire()
        self._resume: _Resume | None = None
        self._after_hold: Callable[[], None] | None = None
        self.ref: Any = None  # the layer above points back at its object here
        lanes.owner = self  # admission makes this owner ready (OwnerLanes.put_app)

    # -- put side (any thread) ----------------------------------------------------------------
    def put_app(self, job: Job) -> Admission:
        """Admit ``job`` (``job.count`` items: a batch counts each message) to the application
        lane, all or nothing, and make the owner ready; see ``OwnerLanes.put_app``."""
        return self.lanes.put_app(job, job.size, job.count)

    def put_app_entries(self, entries: Entries) -> Admission:
        """Admit several jobs at once, all or none (``OwnerLanes.put_app_entries``)."""
        return self.lanes.put_app_entries(entries)

    def put_life(self, job: Job) -> Admission:
        """Admit ``job`` to the lifecycle lane and make the owner ready."""
        verdict = self.lanes.put_life(job, job.size)
        flag = self._flag
        if verdict == ADMITTED and not flag.locked() and flag.acquire(False):
            self.gate.push(self)
        return verdict

    def put_unreserved(self, job: Job, lifecycle: bool = True) -> None:
        """Queue a framework follow-up that must not be refused (no reservation taken)."""
        self.lanes.put_unreserved(job, lifecycle)
        self.wake()

    def wake(self) -> None:
        """Make the owner ready if it is not (what it holds was queued without waking it)."""
        if self._flag.acquire(False):
            self.gate.push(self)

    def put_first(self, job: Job) -> None:
        """Queue ``job`` ahead of everything (see ``OwnerLanes.put_first``)."""
        self.lanes.put_first(job)
        if self._flag.acquire(False):
            self.gate.push(self)

    def drain(self) -> list[Any]:
        """Remove and return every queued item (shutdown, or an owner that never started).

        Only for a held owner or one whose gate will not run again.
        """
        items: list[Any] = []
        for lane in (self.lanes.life, self.lanes.app):
            while lane:
                items.append(lane.popleft())
        return items

    @property
    def held(self) -> bool:
        """Whether the owner is held out of its ring (Yield claim or Join)."""
        return self._held

    # -- gate holder ----------------------------------------------------------------------------
    def hold(self, after: Callable[[], None] | None = None) -> None:
        """Keep this owner out of the ring after the current turn (its gate holder only).

        ``after`` runs once the turn has fully ended and the owner is quiescent (held, not in
        any ring, no turn running): the safe point to move it or hand it to another gate.
        """
        self._held = True
        self._after_hold = after

    def unhold(self, gate: Gate | None = None) -> None:
        """Release a hold, optionally moving the owner to another gate (Join, leave).

        Called by the holder of the gate the owner belongs to after the call. Moving discards
        the yield debt and streak (§7 table: the execution object moves).
        """
        if gate is not None and gate is not self.gate:
            self.gate = gate
            self.lanes.forget()
        self._held = False
        if self.lanes.ready() or self._resume is not None:
            self.gate.push(self)
        else:
            self._settle_empty()

    def yield_pending(self) -> bool:
        """Whether a Yield's continuation waits to run on this owner (a barrier must not pass
        it, kotlin-spot-interface relocation). Read by the gate holder."""
        return self._resume is not None or any(
            isinstance(i, _Resume) for i in self.lanes.snapshot()
        )

    def _take(self) -> Any:
        resume = self._resume
        if resume is not None:
            self._resume = None
            return resume
        if self._held:
            return None
        return self.lanes.take()

    def _settle(self) -> None:
        """After a turn of this owner: back in the ring if it has work, else clear the flag."""
        if self._held:
            after = self._after_hold
            if after is not None:
                self._after_hold = None
                try:
                    after()
                except BaseException:  # noqa: BLE001 - a failed step must not kill the gate
                    _log.exception("the continuation of a hold on %s failed", self.name)
            return
        lanes = self.lanes
        if lanes.app or lanes.life or self._resume is not None:
            self.gate._ring.append(self)
        else:
            self._settle_empty()

    def _settle_empty(self) -> None:
        lanes = self.lanes
        lanes.retire()
        self._flag.release()
        if lanes.app_waiters or lanes.life_waiters:  # after the flag: see OwnerLanes (waiting)
            lanes.serve()
        if (lanes.ready() or self._resume is not None) and self._flag.acquire(False):
            self.gate.push(self)

    def _deliver_resume(self, turn: Turn, value: Any, error: BaseException | None) -> None:
        """A Yield completed (any thread): queue the continuation at the back (§3)."""
        if turn.claimed:
            self._resume = _Resume(turn, value, error)
            self.gate.push(self)  # the flag is still held: the owner was held across the Yield
        else:
            self.lanes.put_unreserved(_Resume(turn, value, error))
            if self._flag.acquire(False):
                self.gate.push(self)


class Gate:
    """One execution right over a ring of ready owners, run by the pool's workers."""

    __slots__ = (
        "__weakref__",
        "_clock",
        "_cont",
        "_flag",
        "_pool",
        "_ring",
        "_run",
        "budget",
        "name",
        "running",
        "running_since",
    )

    def __init__(
        self,
        pool: WorkerPool,
        clock: Clock,
        budget: float,
        name: str = "",
    ) -> None:
        # a list, not a deque: almost every ring holds one owner (a Spot alone), an empty
        # list costs 56 bytes against a deque's 760, and pop(0) of a short list is cheap
        self._ring: list[Owner] = []
        self._flag = threading.Lock()
        self._pool = pool
        self._clock = clock
        self.budget = budget
        self._run = self._run_batch
        self._cont: _Resume | None = None
        self.name = name
        self.running: Turn | None = None
        self.running_since = 0.0

    def push(self, owner: Owner) -> None:
        """Put a ready owner at the back of the ring; schedule the gate if it was idle."""
        self._ring.append(owner)
        flag = self._flag
        if not flag.locked() and flag.acquire(False):  # see Owner._flag
            self._pool.submit_next(self._run)  # a worker's LIFO slot when a turn made it ready

    @property
    def busy(self) -> bool:
        """Whether the execution right is taken (running, scheduled or kept across an await)."""
        return self._flag.locked()

    # -- gate holder ----------------------------------------------------------------------------
    def _run_batch(self) -> None:
        cont = self._cont
        if cont is not None:
            self._cont = None
            if not self._after(cont.turn, cont.turn.resume(cont.value, cont.error)):
                return
        now = self._clock.now
        started = now()
        deadline = started + self.budget
        ring = self._ring
        while True:
            try:
                owner = ring.pop(0)
            except IndexError:
                self._flag.release()
                if ring and self._flag.acquire(False):
                    continue
                return
            item = owner._take()
            if item is None:
                owner._settle()
                continue
            # Turns of this owner, one after another while it is alone in the ring (what
            # settling it and popping it again would do, without the round trip).
            while True:
                self.running_since = started  # one clock read per turn serves both uses
                if type(item) is _Resume:
                    turn = self.running = item.turn
                    outcome = turn.resume(item.value, item.error)
                elif item.light:  # a light job (see Job) as a turn, without the machinery
                    lanes = owner.lanes
                    app = lanes.app
                    outer = _get_current()
                    token = _set_current(outer)  # each turn replaces it; one reset (run_turns)
                    try:
                        while True:  # and the light jobs behind it, while nothing else waits
                            turn = self.running = _new_turn(Turn)
                            turn.job, turn.owner, turn.barriers = item, owner, None
                            _set_current(turn)
                            try:
                                result = item.invoke()
                                if result is not None:  # (a one-way handler's: None, mostly)
                                    _no_coroutine(result)
                            except BaseException as exc:  # noqa: BLE001 - it is the result
                                turn.error = exc
                            self.running = None
                            if turn.barriers is None and turn.error is None:
                                turn.barriers = CLOSED  # its scope ends; the reservation back
                                lanes.release(APPLICATION, item.size, 1)
                            else:  # post-processing, outside the turn: failed, or Defer() (§5)
                                _set_current(outer)
                                self._finish(turn, owner)
                            # The next turn here only if the general checks below would pick
                            # the same one: no other owner in the ring, not held, no resume,
                            # budget left, and the lane rule choosing the application
                            # lane (the lifecycle lane empty: take() is app.popleft(); see
                            # OwnerLanes.take).
                            if ring or owner._held or owner._resume:
                                break
                            started = now()
                            if started >= deadline or lanes.life or not app or not app[0].light:
                                break
                            item = app.popleft()
                            self.running_since = started
                    finally:
                        _reset_current(token)
                    outcome = LIGHT
                else:
                    turn = self.running = Turn(item, owner)
                    outcome = turn.start()
                if outcome == DONE:
                    self.running = None
                    self._finish(turn, owner)
                elif outcome != LIGHT and not self._after(turn, outcome):
                    return  # a regular await keeps the gate; the completion resubmits us
                settled = outcome == RELEASE_GATE  # a Yield settled (or held) its owner already
                started = now()
                if started >= deadline:
                    if not settled:
                        owner._settle()
                    self._pool.submit(self._run)  # budget spent: back of the run queue, flag kept
                    return
                if settled:
                    break
                if ring or owner._held or (item := owner._take()) is None:
                    owner._settle()  # others wait (round robin), held, or nothing left
                    break

    def _after(self, turn: Turn, outcome: Step) -> bool:
        """Handle a step's outcome; ``False`` when the gate stays held across an await."""
        owner = turn.owner
        assert owner is not None
        if outcome == DONE:
            self.running = None
            self._finish(turn, owner)
            owner._settle()
            return True
        susp = turn.suspension
        assert susp is not None
        if outcome == KEEP_GATE:
            wake = turn.completion(self._deliver_keep)
            susp.subscribe(wake)  # the last action on this turn but a cancel's re-check
            if turn.cancelled is not None:  # cancelled as it suspended: it ends now
                wake(None, turn.cancelled)
            return False
        self.running = None
        if owner.claim_on_yield:
            turn.claimed = True
            owner._held = True
        else:
            owner._settle()
        wake = turn.completion(owner._deliver_resume)
        susp.subscribe(wake)
        if turn.cancelled is not None:
            wake(None, turn.cancelled)
        return True

    def _finish(self, turn: Turn, owner: Owner) -> None:
        """Post-processing and the reservation's return, before the gate moves on (§8); the
        caller then settles the owner."""
        if turn.claimed:  # the Yield claim ends with the turn; a Join hold may follow below
            turn.claimed = False
            owner._held = False
        try:
            turn.job.finish(turn)
        except BaseException:  # noqa: BLE001 - post-processing must not kill the gate
            _log.exception("post-processing of a turn on gate %s failed", self.name)
        job = turn.job
        owner.lanes.release(job.lane, job.size, job.count)

    def _deliver_keep(self, turn: Turn, value: Any, error: BaseException | None) -> None:
        self._cont = _Resume(turn, value, error)
        self._pool.submit_next(self._run)


def _no_coroutine(result: object) -> None:
    """A light job's handler, a ``def``, returned ``result``: a coroutine means it should have
    been an ``async def`` (it never runs here): closed, and the turn fails with it, counted
    as a handler error, not dropped unseen."""
    if inspect.iscoroutine(result):
        result.close()
        raise TypeError(
            "a def one-way handler returned a coroutine, which never runs: declare it async def"
        )
