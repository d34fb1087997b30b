"""The two FIFO lanes of one serial execution object (execution-model §7, §11).

Guarantees / assumes:
* Each lane is a ``collections.deque``: ``append`` and ``popleft`` are atomic on both builds.
* Admission (count and bytes) is checked and reserved under ``_put_lock``, the only lock on the
  put side (§11: "only the side that puts items in needs to be protected"). An admitted
  application item makes the lanes' owner ready (its flag taken in one step, see ``Owner``).
* A reservation is held until the work item's terminal completion (§7), not until it leaves the
  queue. Releases are counted in ``_app_out`` / ``_life_out`` by the current gate holder only:
  one writer, so the take side takes no lock. Producers read them under ``_put_lock``; a stale
  read can only under-admit, never over-admit.
* The lane choice is made only by the gate holder, in one step at a turn boundary.
* No front insertion: items only ever go to the back (§6, §7).
* Waiting for room (python-api §9, seed §1 "outbound admission waiters"): a producer that may
  wait is queued as a :class:`RoomWaiter` when its lane is full, at most ``LaneLimits.waiters``
  per lane, and admitted in arrival order as reservations come back. While anyone waits, a
  plain put is refused (first come, first served). Waiters are served once a quarter of the
  lane is free again (``_serve_at``: a lane that is full stays "full" until then), so under
  sustained overload the gate holder wakes a waiting producer once per many messages, not
  once per message, and the producers refill the lane with plain puts in between. Waiters
  are served by whoever returns a
  reservation (``release``) and by the gate holder when the owner goes idle, after it lets the
  flag go (``Owner._settle_empty``), the same hand-over that makes a put after the holder's
  last look at the lanes still run; a waiter queued after the last release re-checks the room
  itself. A seal fails every waiter with ``CLOSED``; ``notify`` always runs outside the lock.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from enum import Enum
from typing import Any, NamedTuple


class Lane(Enum):
    """Where a work item's reservation is held (§7)."""

    APPLICATION = "application"
    LIFECYCLE = "lifecycle"
    UNRESERVED = "unreserved"  # a framework follow-up record that holds no reservation


class Admission(Enum):
    """The verdict of a put: admitted, or why nothing was queued (§7)."""

    ADMITTED = "admitted"
    FULL_COUNT = "full_count"
    FULL_BYTES = "full_bytes"
    CLOSED = "closed"  # admission is closed (a seal): nothing is queued
    WAITING = "waiting"  # queued as a RoomWaiter: its notify() tells the outcome later


# module names for the hot path: a global read, not an attribute lookup per send
APPLICATION, LIFECYCLE, UNRESERVED = Lane.APPLICATION, Lane.LIFECYCLE, Lane.UNRESERVED
ADMITTED, FULL_COUNT, FULL_BYTES = Admission.ADMITTED, Admission.FULL_COUNT, Admission.FULL_BYTES
ADMISSION_CLOSED, WAITING = Admission.CLOSED, Admission.WAITING


_SNAPSHOT_TRIES = 4  # copies of a lane ``close_if_idle`` tries while a consumer pops


class LaneLimits(NamedTuple):
    """Admission limits of one owner's two lanes; defaults are the seed values of §7."""

    app_items: int = 1024
    app_bytes: int = 64 * 1024 * 1024
    app_retained_per_item: int = 256
    life_items: int = 128
    life_bytes: int = 4 * 1024 * 1024
    lifecycle_streak: int = 8
    waiters: int = 1024  # producers waiting for room, per lane (python-api §9; seed §1)


class Entries:
    """Several queue entries admitted together, all or none, behind one check of the limits
    (a batch whose messages each need a turn alone, python-api §8): reserved as one and
    appended one after another with nothing between them; each entry is then an item of its
    own (``count`` 1) that returns its own reservation. ``size``: their payload bytes."""

    __slots__ = ("count", "items", "size")

    def __init__(self, items: list[Any], size: int) -> None:
        self.items = items
        self.size = size
        self.count = len(items)


class RoomWaiter:
    """A producer waiting for room in one lane (python-api §9): ``item`` is appended, with its
    reservation, once it fits and everyone before it got in; then ``notify(ADMITTED)`` runs
    (outside the lanes' lock, on the thread that made the room). A seal ends the wait with
    ``notify(CLOSED)``. ``cancel_wait`` withdraws it while it still waits."""

    __slots__ = ("bounded", "cost", "count", "item", "lane", "notify", "payload", "queued")

    def __init__(
        self, item: Any, payload_bytes: int, count: int, notify: Callable[[Admission], object],
        lane: Lane = APPLICATION, bounded: bool = True,
    ) -> None:  # fmt: skip
        self.item = item
        self.bounded = bounded  # counts against LaneLimits.waiters (False: bounded elsewhere)
        self.payload = payload_bytes
        self.count = count
        self.notify = notify
        self.lane = lane
        self.cost = 0  # set by the lanes: what it reserves
        self.queued = False  # in a waiter queue now (read and written under the put lock)


class OwnerLanes:
    """Application and lifecycle FIFOs with separate reservations, streak and yield debt (§7)."""

    __slots__ = (
        "_app_bounded",
        "_app_bytes",
        "_app_in",
        "_app_in_bytes",
        "_app_items",
        "_app_out",
        "_app_out_bytes",
        "_life_bounded",
        "_life_in",
        "_life_in_bytes",
        "_life_out",
        "_life_out_bytes",
        "_put_lock",
        "_retained",
        "_serve_at",
        "app",
        "app_waiters",
        "closed",
        "debt",
        "life",
        "life_waiters",
        "limits",
        "owner",
        "refused",
        "streak",
        "waited",
    )

    def __init__(self, limits: LaneLimits) -> None:
        # made on first use (under _put_lock): an empty deque costs 760 bytes, and most owners
        # are idle most of the time (10,000 Spots should not cost 15 MB of empty queues)
        self.app: deque[Any] | None = None
        self.life: deque[Any] | None = None
        self.limits = limits
        # the application lane's limits as plain slots: read on every admission and release
        self._app_items, self._app_bytes = limits.app_items, limits.app_bytes
        self._retained = limits.app_retained_per_item
        # waiters for room are served when at most this many items are reserved (see above)
        self._serve_at = limits.app_items - max(1, limits.app_items // 4)
        self._put_lock = threading.Lock()
        self._app_in = self._app_in_bytes = self._app_out = self._app_out_bytes = 0
        self._life_in = self._life_in_bytes = self._life_out = self._life_out_bytes = 0
        self.closed = False  # set and cleared under _put_lock: a seal is atomic with admission
        self.streak = 0  # lifecycle turns chosen in a row
        self.debt = False  # an application turn is owed (§7 yield debt)
        self.owner: Any = None  # the Owner these lanes belong to: put_app makes it ready
        # producers waiting for room, per lane (made on first use, like the lanes)
        self.app_waiters: deque[RoomWaiter] | None = None
        self.life_waiters: deque[RoomWaiter] | None = None
        # how many of each lane's waiters are bounded here (``LaneLimits.waiters``): counted
        # as they come and go, since summing them at every wait was quadratic under this lock
        self._app_bounded = self._life_bounded = 0
        self.refused = 0  # calls refused for want of room (count or bytes), for status
        self.waited = 0  # producers that had to wait for room, for status

    # -- put side (any thread) ----------------------------------------------------------------
    def put_app(
        self, item: Any, payload_bytes: int, count: int = 1, ready: bool = True
    ) -> Admission:
        """Reserve ``payload_bytes`` plus the retained cost of ``count`` items (a batch is one
        queue entry holding ``count`` messages); append ``item`` to the app lane, and (``ready``)
        make the owner, if these lanes have one, ready.

        Returns ``ADMITTED``, ``FULL_COUNT``, ``FULL_BYTES`` or ``ADMISSION_CLOSED``; when not
        admitted nothing changes.
        """
        cost = payload_bytes + self._retained * count
        lock = self._put_lock
        lock.acquire()  # not ``with``: the hot path, and ``with`` costs twice as much here
        try:
            if self.closed:
                return ADMISSION_CLOSED
            if self._app_in - self._app_out + count > self._app_items or self.app_waiters:
                return FULL_COUNT  # (while anyone waits for room, the room is theirs)
            if self._app_in_bytes - self._app_out_bytes + cost > self._app_bytes:
                return FULL_BYTES
            self._app_in += count
            self._app_in_bytes += cost
            app = self.app
            if app is None:
                app = self.app = deque()
            app.append(item)
        finally:
            lock.release()
        owner = self.owner
        if owner is not None and ready:  # as Owner.put_life does, here to save a frame per send
            flag = owner._flag
            if not flag.locked() and flag.acquire(False):
                owner.gate.push(owner)
        return ADMITTED

    def put_app_moved(
        self, item: Any, payload_bytes: int, count: int = 1, ready: bool = True
    ) -> bool:
        """Append an item that was admitted elsewhere (another node, or the activation before
        this one) and moved here with its queue.

        It was accepted once, so it is never refused again (§7: nothing accepted is lost): the
        reservation is taken past the limits and past a seal. Returns ``True`` when the lane is
        now over a limit (it admits nothing new until it drains below it). ``ready=False``:
        the owner is not made ready (its maker wakes it once it is published).
        """
        cost = payload_bytes + self._retained * count
        with self._put_lock:
            self._app_in += count
            self._app_in_bytes += cost
            app = self.app
            if app is None:
                app = self.app = deque()
            app.append(item)
            over = (
                self._app_in - self._app_out > self._app_items
                or self._app_in_bytes - self._app_out_bytes > self._app_bytes
            )
        if ready:
            self._ready()
        return over

    def put_app_entries(self, entries: Entries) -> Admission:
        """``put_app`` for several entries: all of them admitted and appended, or none."""
        count = entries.count
        cost = entries.size + self._retained * count
        with self._put_lock:
            if self.closed:
                return ADMISSION_CLOSED
            if self._app_in - self._app_out + count > self._app_items or self.app_waiters:
                return FULL_COUNT
            if self._app_in_bytes - self._app_out_bytes + cost > self._app_bytes:
                return FULL_BYTES
            self._app_in += count
            self._app_in_bytes += cost
            if self.app is None:
                self.app = deque()
            self.app.extend(entries.items)
        self._ready()
        return ADMITTED

    def put_life(self, item: Any, payload_bytes: int) -> Admission:
        """Reserve in the lifecycle lane, which shares nothing with the application lane (§7)."""
        lim = self.limits
        with self._put_lock:
            if self.closed:
                return ADMISSION_CLOSED
            if self._life_in - self._life_out >= lim.life_items or self.life_waiters:
                return FULL_COUNT
            if self._life_in_bytes - self._life_out_bytes + payload_bytes > lim.life_bytes:
                return FULL_BYTES
            self._life_in += 1
            self._life_in_bytes += payload_bytes
            if self.life is None:
                self.life = deque()
            self.life.append(item)
        return ADMITTED

    def set_closed(self, closed: bool, end_waits: bool = True) -> None:
        """Close (or reopen) admission atomically with every producer: after ``True`` returns,
        no item can be admitted until ``False``. Unreserved framework records still enter.
        Closing ends every wait for room with ``notify(CLOSED)`` (nothing of theirs queued),
        unless ``end_waits`` is ``False``: a caller holding a lock that those waiters' routing
        takes then ends them (``end_waits()``) once it let that lock go."""
        with self._put_lock:
            self.closed = closed
        if closed and end_waits:
            self.end_waits()

    def close_if_idle(self, is_tick: Callable[[Any], bool]) -> bool:
        """Close admission (as ``set_closed(True)``) only if nothing runs and the
        application lane holds nothing but items ``is_tick`` says are timer ticks, the
        lifecycle lane nothing, and no producer waits for room: all read under the lock
        every producer takes, so an idle eviction never seals an owner that has just
        admitted work (a tick a timer is about to put comes before, and counts, or after,
        and is refused). ``False``: not idle (nothing changed)."""
        with self._put_lock:
            # a copy (the consumer pops without this lock: an iteration it meets is tried
            # again, a few times, and else not idle for now); only pops can happen meanwhile,
            # and an item popped is reserved until it ends: counted below, as not idle
            items: tuple[Any, ...] | None = None
            for _ in range(_SNAPSHOT_TRIES):
                try:
                    items = tuple(self.app or ())
                    break
                except RuntimeError:  # "deque mutated during iteration"
                    continue
            if (
                items is None
                or self.closed
                or self.life
                or self.app_waiters
                or self.life_waiters
                or self._app_in - self._app_out != len(items)  # (an item runs, or a batch)
                or self._life_in != self._life_out
                or not all(is_tick(item) for item in items)
            ):
                return False
            self.closed = True
            return True

    def end_waits(self) -> None:
        """End every wait for room with ``notify(CLOSED)``, nothing of theirs queued (a seal,
        or an owner that stops taking work, as a close does)."""
        ended: list[RoomWaiter] = []
        with self._put_lock:
            for waiters in (self.app_waiters, self.life_waiters):
                while waiters:
                    waiter = waiters.popleft()
                    waiter.queued = False
                    ended.append(waiter)
            self._app_bounded = self._life_bounded = 0
        for waiter in ended:
            waiter.notify(ADMISSION_CLOSED)

    # -- waiting for room (python-api §9) -------------------------------------------------------
    def larger_than_lane(self, waiter: RoomWaiter) -> bool:
        """Whether ``waiter`` is more than its lane holds even empty (it would never fit);
        sets its ``cost``, what it reserves once admitted."""
        if waiter.lane == APPLICATION:
            waiter.cost = waiter.payload + self._retained * waiter.count
            return waiter.count > self._app_items or waiter.cost > self._app_bytes
        waiter.cost = waiter.payload
        lim = self.limits
        return waiter.count > lim.life_items or waiter.cost > lim.life_bytes

    def wait_room(self, waiter: RoomWaiter) -> Admission:
        """Admit ``waiter.item`` now if it fits and nobody waits before it (``ADMITTED``:
        ``notify`` is not called), else queue the waiter (``WAITING``). Refused at once with
        nothing queued: ``CLOSED`` when sealed; ``FULL_COUNT`` / ``FULL_BYTES`` when the lane
        could never hold it, or ``LaneLimits.waiters`` producers wait already."""
        app = waiter.lane == APPLICATION
        too_big = self.larger_than_lane(waiter)
        with self._put_lock:
            if self.closed:
                return ADMISSION_CLOSED
            waiters = self.app_waiters if app else self.life_waiters
            crowded = (  # by the waiters bounded here (those from peers are bounded by
                waiter.bounded  # their peer's backlog: a caller here is not refused for them)
                and (self._app_bounded if app else self._life_bounded) >= self.limits.waiters
            )
            if too_big or crowded:
                self.refused += 1
                return FULL_BYTES if too_big and waiter.count == 1 else FULL_COUNT
            if not waiters and self._fits(waiter):
                self._admit(waiter)
                admitted = True
            else:
                if waiters is None:
                    waiters = deque()
                    if app:
                        self.app_waiters = waiters
                    else:
                        self.life_waiters = waiters
                waiters.append(waiter)
                waiter.queued = True
                self._counted(waiter, 1)
                self.waited += 1
                admitted = False
        if admitted:
            self._ready()
            return ADMITTED
        # Room may have come back between the check above and the append (a release takes no
        # lock): look again, now that a releaser would see this waiter.
        self.serve()
        return WAITING

    def _counted(self, waiter: RoomWaiter, change: int) -> None:
        """(Under the put lock.) ``waiter`` joined (1) or left (-1) its lane's waiters."""
        if waiter.bounded:
            if waiter.lane == APPLICATION:
                self._app_bounded += change
            else:
                self._life_bounded += change

    def cancel_wait(self, waiter: RoomWaiter) -> bool:
        """Withdraw a waiter: ``True`` if it was still waiting (nothing of it was queued, and
        ``notify`` will not be called); ``False`` if it was admitted or ended already."""
        with self._put_lock:
            if not waiter.queued:
                return False
            waiters = self.app_waiters if waiter.lane == APPLICATION else self.life_waiters
            assert waiters is not None
            waiters.remove(waiter)
            waiter.queued = False
            self._counted(waiter, -1)
            return True

    def take_waiters(self) -> list[RoomWaiter]:
        """Take every producer waiting for room in the application lane out, in their order
        (``cancel_wait`` says ``False`` for each from now on; ``notify`` is the caller's to
        call): an owner that is replaced hands them to the one after it."""
        with self._put_lock:
            waiters = self.app_waiters
            if not waiters:
                return []
            out = list(waiters)
            waiters.clear()
            self._app_bounded = 0
            for waiter in out:
                waiter.queued = False
        return out

    def note_refused(self) -> None:
        """Count a put the caller finally refused for want of room (status, per target)."""
        with self._put_lock:
            self.refused += 1

    def waiting(self) -> int:
        """Producers waiting for room now, both lanes."""
        return len(self.app_waiters or ()) + len(self.life_waiters or ())

    def serve(self) -> None:
        """Admit the waiters that fit now, in order, and tell them (outside the lock)."""
        admitted: list[RoomWaiter] = []
        with self._put_lock:
            if not self.closed:
                for waiters in (self.app_waiters, self.life_waiters):
                    if not waiters or not self._low(waiters[0].lane):
                        continue
                    while waiters and self._fits(waiters[0]):
                        waiter = waiters.popleft()
                        waiter.queued = False
                        self._counted(waiter, -1)
                        self._admit(waiter)
                        admitted.append(waiter)
        if admitted:
            self._ready()
            for waiter in admitted:
                waiter.notify(ADMITTED)

    def _low(self, lane: Lane) -> bool:
        """(Under the put lock.) Whether ``lane`` has drained enough to serve its waiters."""
        if lane == APPLICATION:
            return self._app_in - self._app_out <= self._serve_at
        lim = self.limits
        return self._life_in - self._life_out <= lim.life_items - max(1, lim.life_items // 4)

    def _fits(self, waiter: RoomWaiter) -> bool:
        """(Under the put lock.) Whether ``waiter`` fits in its lane now."""
        if waiter.lane == APPLICATION:
            return (
                self._app_in - self._app_out + waiter.count <= self._app_items
                and self._app_in_bytes - self._app_out_bytes + waiter.cost <= self._app_bytes
            )
        lim = self.limits
        return (
            self._life_in - self._life_out + waiter.count <= lim.life_items
            and self._life_in_bytes - self._life_out_bytes + waiter.cost <= lim.life_bytes
        )

    def _admit(self, waiter: RoomWaiter) -> None:
        """(Under the put lock.) Reserve for ``waiter`` and append its item."""
        if waiter.lane == APPLICATION:
            self._app_in += waiter.count
            self._app_in_bytes += waiter.cost
            if self.app is None:
                self.app = deque()
            item = waiter.item
            if type(item) is Entries:
                self.app.extend(item.items)
            else:
                self.app.append(item)
        else:
            self._life_in += waiter.count
            self._life_in_bytes += waiter.cost
            if self.life is None:
                self.life = deque()
            self.life.append(waiter.item)

    def _ready(self) -> None:
        """Make the owner ready after an admission (``put_app`` inlines it: the hot path)."""
        owner = self.owner
        if owner is not None:
            flag = owner._flag
            if not flag.locked() and flag.acquire(False):
                owner.gate.push(owner)

    def put_unreserved(self, item: Any, lifecycle: bool = False) -> None:
        """Append to the back of a lane without a reservation (never refused).

        For a Yield resume record, which runs under the reservation its turn already holds
        (§3), and for framework follow-ups (a Join outcome) that must not be lost to a full lane.
        """
        with self._put_lock:
            if lifecycle:
                if self.life is None:
                    self.life = deque()
                self.life.append(item)
            else:
                if self.app is None:
                    self.app = deque()
                self.app.append(item)

    def put_first(self, item: Any) -> None:
        """Put ``item`` at the head of the lifecycle lane, owing nothing to the application
        lane: framework control that must run before anything already queued (a callback
        that held messages wait for). Never refused."""
        with self._put_lock:
            if self.life is None:
                self.life = deque()
            self.life.appendleft(item)
            self.debt = False

    # -- take side (gate holder only) ---------------------------------------------------------
    def ready(self) -> bool:
        """Whether either lane holds an item."""
        return bool(self.app) or bool(self.life)

    def take(self) -> Any:
        """Pop the next item by the lane rule of §7, or ``None`` when both lanes are empty.

        Lifecycle first when both are ready, at most ``lifecycle_streak`` in a row; then one
        application item is owed (debt) and is taken before lifecycle again.

        Every application take leaves ``streak`` 0 and ``debt`` off, so after one, and while the
        lifecycle lane stays empty, the next take is ``app.popleft()`` and changes nothing
        else: the gate's run of consecutive light jobs pops them so (``Gate._run_batch``).
        """
        app, life = self.app, self.life
        if not life:
            if not app:
                return None
            self.streak = 0
            self.debt = False
            return app.popleft()
        if app and self.debt:
            self.debt = False
            self.streak = 0
            return app.popleft()
        self.streak += 1
        if self.streak >= self.limits.lifecycle_streak:
            self.debt = True
        item = life.popleft()
        if not life:  # lifecycle work is rare: give the empty deque back (producers lock too)
            with self._put_lock:
                if not self.life:
                    self.life = None
        return item

    def snapshot(self) -> list[Any]:
        """Every queued item, lifecycle lane then application lane, copied under the put lock
        (producers may append meanwhile; iterating a deque they append to would fail)."""
        lock = self._put_lock
        lock.acquire()
        try:
            return [*(self.life or ()), *(self.app or ())]
        finally:
            lock.release()

    def retire(self) -> None:
        """The owner goes idle (gate holder only): give an empty application deque back, so
        an idle owner costs no queue (producers make a new one under the same lock)."""
        if self.app is not None and not self.app:
            lock = self._put_lock
            lock.acquire()
            try:
                if not self.app:
                    self.app = None
            finally:
                lock.release()

    def release(self, lane: Lane, payload_bytes: int, count: int = 1) -> None:
        """Return a reservation at the item's terminal completion (gate holder only)."""
        if lane == APPLICATION:
            self._app_out += count
            self._app_out_bytes += payload_bytes + self._retained * count
            if self.app_waiters and self._app_in - self._app_out <= self._serve_at:
                self.serve()  # room for those who wait, first (python-api §9)
        elif lane == LIFECYCLE:
            self._life_out += 1
            self._life_out_bytes += payload_bytes
            if self.life_waiters:
                self.serve()

    def forget(self) -> None:
        """The owner ends or moves: discard the debt and the streak together (§7 table)."""
        self.streak = 0
        self.debt = False

    # -- status -------------------------------------------------------------------------------
    def reserved(self) -> tuple[int, int, int, int]:
        """(application items, application bytes, lifecycle items, lifecycle bytes) held."""
        return (
            self._app_in - self._app_out,
            self._app_in_bytes - self._app_out_bytes,
            self._life_in - self._life_out,
            self._life_in_bytes - self._life_out_bytes,
        )
