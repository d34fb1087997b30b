"""Calls kept for later, and the callers that wait for room in what keeps them (python-api §9).

Three places keep calls for a target that cannot take them yet, each bounded by what the
target's lane holds (items and payload bytes): a move's source parks them while the object is
sealed, a move's target keeps them for an object that has not opened yet
(``zlink.relocation``), and a node keeps them behind a route fence until the fence is back
(``MeshRouter.switch``). Past the bound, a caller that can wait (a send's ``wait()`` /
``future()`` / ``await``, a request within its deadline, a call from a peer: that peer's
backlog, which pauses it) waits behind what is kept, first come first served, and is taken in
when the keeper goes on; a plain ``submit()`` is ``ResourceExhausted``, with nothing queued.
Unbounded, a slow fence let one node keep 298,426 calls, whose sending again held its
infrastructure thread past a lease renewal. What a move's target keeps of the calls its source
relays once the object is restored is bounded at the source, which counts them until the
commit (one arrival kept 36,842 before). Not bounded yet (a review and a probe found them):
what the target keeps from the commit until it opens (its own fences back: the source relays
at once), and the waits of calls a node routes again after a move that did not happen, which
count against no peer's backlog.

Guarantees / assumes:
* Every function here runs under its keeper's lock (the relocator's, or the router's
  ``route_lock``) but ``accepted``, which runs with no lock held (a caller's future may run
  callbacks of its own). ``withdraw`` takes that same lock.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..errors import ResourceExhausted
from ..messaging.completion import Admitted, Completion, in_progress

if TYPE_CHECKING:
    from ..executor import LaneLimits
    from ..messaging.calls import BatchSendCall, MessageCall
    from .runtime import Runtime

_Item = TypeVar("_Item")


@dataclass(slots=True, eq=False)
class KeptWait(Generic[_Item]):
    """A call (or a whole batch: ``items``) that met a keeper with no room: it waits for the
    keeper to go on, its caller on ``room`` (a send's wait, or a peer's call: that peer's
    backlog) or ``reply`` (a request, within its own deadline); taken in, in order, then. The
    items are what the keeper keeps (envelopes, or calls); a fence that came behind such
    calls waits with neither caller."""

    items: list[_Item]
    room: Admitted | None
    reply: Completion | None
    batch: BatchSendCall | None = None  # on a move's target: the batch ``items`` split, if any

    @property
    def bounded(self) -> bool:
        """Whether its caller waits on this node (a send's wait, a request), and counts
        against ``LaneLimits.waiters``; one from a peer is bounded by that peer's backlog,
        and a fence has no caller."""
        if self.room is not None:
            return self.room.peer is None
        return self.reply is not None

    def gave_up(self) -> bool:
        """Its caller stopped waiting (a deadline, a cancel): it is dropped, never sent."""
        return (self.room is not None and self.room.done) or (
            self.reply is not None and self.reply.done
        )


class WaitLine(Generic[_Item]):
    """The calls that wait behind one keeper, in arrival order, with a count of those
    ``bounded`` here (their callers wait on this node): ``wait_behind`` asks it for every call
    past the bound, and counting them each time was quadratic (a probe's move re-routed 22,849
    waits so under a lock its node needed, and the node fenced itself)."""

    __slots__ = ("bounded", "waits")

    def __init__(self) -> None:
        self.waits: list[KeptWait[_Item]] = []
        self.bounded = 0

    def __bool__(self) -> bool:
        return bool(self.waits)

    def __len__(self) -> int:
        return len(self.waits)

    def __iter__(self) -> Iterator[KeptWait[_Item]]:
        return iter(self.waits)

    def append(self, wait: KeptWait[_Item]) -> None:
        self.waits.append(wait)
        self.bounded += wait.bounded

    def remove(self, wait: KeptWait[_Item]) -> bool:
        """Take ``wait`` out; ``False`` if it was not here (taken in, or ended, already)."""
        try:
            self.waits.remove(wait)
        except ValueError:
            return False
        self.bounded -= wait.bounded
        return True

    def take(self) -> list[KeptWait[_Item]]:
        """Every wait, in order; the line is empty after (in place: a wait's ``withdraw``
        holds this line, and finds its wait gone)."""
        waits, self.waits, self.bounded = self.waits, [], 0
        return waits


def fits(limits: LaneLimits, waiting: WaitLine[Any], count: int, size: int, more: int,
         more_size: int) -> bool:  # fmt: skip
    """Whether a keeper may take ``more`` calls (``more_size`` bytes) on top of the ``count``
    (``size`` bytes) it holds for a target, behind no waiting call: at most what the
    target's lane holds, items and bytes (python-api §9). A batch larger than the lane alone
    fits an empty keeper (all or none, §8)."""
    return not (
        waiting
        or count + more > max(limits.app_items, more)
        or (count and size + more_size > limits.app_bytes)
    )


def wait_behind(
    rt: Runtime, waiting: WaitLine[_Item], items: list[_Item],
    call: MessageCall | BatchSendCall, reply: Completion | None, room: Admitted | None,
    withdraw: Callable[[KeptWait[_Item]], bool], full: str, where: str,
    batch: BatchSendCall | None = None,
) -> None:  # fmt: skip
    """(The keeper's lock held.) The keeper is full: ``call`` (as ``items``) waits behind it
    on ``waiting``, or, a plain ``submit()``, or past ``LaneLimits.waiters`` callers waiting
    already (a call from a peer waits as that peer's backlog instead), is refused with
    ``ResourceExhausted``, nothing queued. ``withdraw`` takes a wait back (its caller gave up:
    ``True`` if it still waited); ``full`` says what is full (after the target's name, in the
    error), ``where`` what a send waits for (when its wait runs out)."""
    plain = room is None and reply is None
    from_peer = room is not None and room.peer is not None
    limit = rt.limits.waiters  # (those from peers, bounded by their backlog, are not counted:
    crowded = waiting.bounded >= limit  # as lanes)
    if plain or (not from_peer and crowded):
        rt.metrics.add("rejected_admissions")
        raise ResourceExhausted(
            f"{call.kind} {call.target!r} {full} is full or {limit} callers wait for it "
            "already; nothing was queued"
        )
    wait = KeptWait(items, room, reply, batch)
    waiting.append(wait)
    rt.metrics.add("admission_waits")
    if room is not None:
        room.withdraw = functools.partial(withdraw, wait)
        if reply is not None:  # a request that gives up (its deadline) ends its wait too
            reply.add_callback(functools.partial(_end_wait, room))
        # a send made here waits up to its admission deadline (unless it has one from an
        # earlier wait); a request has its own deadline; a call from a peer waits as that
        # peer's backlog (which pauses it)
        elif not from_peer and room.timer is None:
            rt.arm_room(room, f"{where} {call.kind} {call.target!r}")


def unwait(lock: Any, waiting: WaitLine[_Item], wait: KeptWait[_Item]) -> bool:
    """Take back ``wait`` (its caller gave up), under its keeper's ``lock``: ``True`` if it
    still waited (nothing of it was queued)."""
    with lock:
        return waiting.remove(wait)


def take_waiting(
    waiting: WaitLine[_Item], take: Callable[[list[_Item]], None]
) -> list[tuple[Admitted, BaseException | None]]:
    """(The keeper's lock held.) The calls that waited are taken in (``take``), in their
    order; those whose callers gave up are dropped, never sent (a peer's request that passed
    its deadline: its wait ends with that, so the peer's backlog lets it go). Returns the
    rooms to tell (``accepted``) once the lock is let go."""
    rooms: list[tuple[Admitted, BaseException | None]] = []
    for wait in waiting.take():
        if wait.gave_up():
            if wait.room is not None and not wait.room.done:
                assert wait.reply is not None  # (a room that is done did not wait)
                rooms.append((wait.room, wait.reply.error))
            continue
        if wait.room is not None:
            wait.room.withdraw = in_progress  # queued from now on: no longer withdrawn
            rooms.append((wait.room, None))
        take(wait.items)
    return rooms


def accepted(rooms: list[tuple[Admitted, BaseException | None]]) -> None:
    """Tell callers that waited that their calls are queued, or why not (no lock held: a
    caller's future may run callbacks of its own)."""
    for room, error in rooms:
        room.set(None, error)


def _end_wait(room: Admitted, _value: object, error: BaseException | None) -> None:
    """A request that waited ended (its deadline, say) before it was taken in: its wait ends
    with it (a peer's backlog lets it go)."""
    if error is not None:
        room.abandon(error)
