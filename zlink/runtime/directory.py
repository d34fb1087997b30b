"""What one node holds: its live Spots, Actors and Channels, under a lock of its own.

Guarantees / assumes:
* ``lock`` (``LockRank.DIRECTORY``) guards *writes* to the tables (activation, removal,
  arrival of a move, subscription changes); reads are plain ``dict.get`` on the hot path.
  Lock order (``zlink.lock_order``): route -> relocator -> directory -> leaves.
* The tables are created once and never rebound, so the runtime may hold them directly.
* ``next_generation`` numbers incarnations made without a Location Store (one node alone).
* A Spot or Actor leaves its table only through ``forget`` (under ``lock``), which keeps what
  it counted in ``stats`` (``type_stats``).
* ``topics`` (topic -> Spot ids) and ``subscribed`` (Spot id -> topics) are one relation kept
  both ways, written only through ``subscribe`` (under ``lock``), each value a frozenset
  replaced whole (readers take no lock). A Spot's subscriptions belong to its incarnation on
  this node: ``forget`` drops them, so whatever way a Spot stops living here (closed,
  evicted, failed to activate, dropped by a fencing, moved away, a move in that did not
  happen), the tables list only Spots in ``spots``, and a later incarnation under the same
  id starts with none. A move takes them along: the source reads them (``subscribed``) into
  its payload, the target adds them (``subscribe_all``) as the Spot arrives.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from ..executor import ranked_lock
from ..lock_order import LockRank
from ..types import SpotKind, TargetKind
from .acts import GONE, ActorAct, ChannelAct, SpotAct
from .type_stats import TypeStats

if TYPE_CHECKING:
    from ..app import App


class Directory:
    """The live objects of one node (see the module docstring)."""

    def __init__(self, app: App) -> None:
        self.spots: dict[str, SpotAct] = {}
        self.actors: dict[str, ActorAct] = {}
        self.channels: dict[str, ChannelAct] = {}
        self.entries: dict[str, SpotAct] = {}  # actor type -> its Entry Spot
        self.topics: dict[str, frozenset[str]] = {}  # topic -> subscribed Spot ids (copy on write)
        self.subscribed: dict[str, frozenset[str]] = {}  # Spot id -> its topics (copy on write)
        self.lock = ranked_lock("runtime.directory", LockRank.DIRECTORY)
        self.stats = TypeStats()  # per-type counts and latency (its lock is a leaf)
        self._generations = itertools.count(1)
        instance_types = [s.name for s in app.spots.values() if s.kind is SpotKind.INSTANCE]
        self.only_instance_type = instance_types[0] if len(instance_types) == 1 else None

    def next_generation(self) -> int:
        """A new ``ObjectGeneration`` for an incarnation made without a store."""
        return next(self._generations)

    def forget(self, act: SpotAct | ActorAct, successor: SpotAct | None = None) -> None:
        """``act`` leaves its table if it is there, a Spot with its subscriptions (the caller
        holds ``lock``), and its admission closes: a call that found it before and is put
        only now is refused, and routed again (``Runtime._not_ready``), never run on an
        object that is gone (closed, failed to activate, dropped, moved away). Its waits for
        room end once the caller lets the lock go (``OwnerLanes.end_waits``). ``successor``:
        the Spot's next activation takes its place in one step (a reader that takes no lock
        finds one or the other, never none, which would send it to the store)."""
        act.owner.lanes.set_closed(True, end_waits=False)
        table: dict[str, Any] = self.spots if isinstance(act, SpotAct) else self.actors
        if table.get(act.name) is act:
            if successor is not None:
                table[act.name] = successor
            else:
                del table[act.name]
            self.stats.retire(act)
            if isinstance(act, SpotAct):
                for topic in self.subscribed.get(act.name, ()):
                    self.subscribe(act.name, topic, False)

    def subscribe(self, spot_id: str, topic: str, on: bool) -> None:
        """Add (``on``) or remove one subscription of ``spot_id`` (the caller holds ``lock``)."""
        ids = self.topics.get(topic, frozenset())
        mine = self.subscribed.get(spot_id, frozenset())
        ids, mine = (ids | {spot_id}, mine | {topic}) if on else (ids - {spot_id}, mine - {topic})
        _put(self.topics, topic, ids)
        _put(self.subscribed, spot_id, mine)

    def subscribe_all(self, spot_id: str, topics: tuple[str, ...]) -> None:
        """``spot_id`` subscribes to each of ``topics`` (it arrives with them; the caller holds
        ``lock``)."""
        for topic in topics:
            self.subscribe(spot_id, topic, True)

    def has_live(self, target: str, kind: TargetKind | None = None) -> bool:
        """Whether a Spot or Actor ``target`` lives on this node (in any state but gone);
        given ``kind``, one of that kind. (Spots and Actors share one id space, the Location
        Store's, but a call names the kind it means: a Spot's id called as an Actor's is
        ``NotFound``, python-api §5.)"""
        if kind is None:
            act = self.spots.get(target) or self.actors.get(target)
        else:
            act = (self.actors if kind == TargetKind.ACTOR else self.spots).get(target)
        return act is not None and act.state != GONE

    def kind_of(self, object_id: str) -> tuple[TargetKind, str] | None:
        """The kind and type of what lives under ``object_id`` here, if anything does (the
        caller holds ``lock``, or reads a moment's view): the one id space a create keeps
        to."""
        for kind, table in ((TargetKind.SPOT, self.spots), (TargetKind.ACTOR, self.actors)):
            act = table.get(object_id)
            if act is not None and act.state != GONE:
                return kind, act.spec.name
        return None


def _put(table: dict[str, frozenset[str]], key: str, value: frozenset[str]) -> None:
    """``table[key] = value``, or no entry at all for an empty ``value``."""
    if value:
        table[key] = value
    else:
        table.pop(key, None)
