"""The classes an application subclasses, and the values their callbacks exchange.

Every callback is optional and may be ``def`` or ``async def`` (python-api §3). Spot, Actor and
Channel classes are constructed by the framework as ``Cls(context)``; the base ``__init__``
keeps the context as ``self.context``.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from ..errors import InvalidArgument, ZLinkError

if TYPE_CHECKING:
    from ..messaging.context import ActorContext, EntrySpotContext, InstanceSpotContext, SpotContext
    from ..messaging.message import Message


class SpotKind(IntEnum):
    """The kinds of Spot, with the contract values of the seed (kotlin-spot-interface)."""

    INVALID = 0
    ENTRY = 1
    USER = 2
    INSTANCE = 3


class SpotCloseReason(IntEnum):
    """Why a Spot is closing, with the contract values of the seed."""

    EXPLICIT_CLOSE = 0
    HOST_SHUTDOWN = 1
    RELOCATION_OUT = 2
    IDLE_EVICTED = 3


@dataclass(frozen=True, slots=True)
class SpotClosingContext:
    """What ``on_closing`` receives: the reason and an absolute deadline on the node's clock.

    A suspending ``on_closing`` still waiting at ``deadline`` is cancelled: ``Cancelled`` is
    raised at its ``await``. A ``def`` one that blocks past it cannot be interrupted.
    """

    reason: SpotCloseReason
    deadline: float


_MAX_GENERATION = 2**63 - 1
_T = TypeVar("_T")
Maybe: TypeAlias = "_T | Awaitable[_T]"  # every callback may be ``def`` or ``async def``


@dataclass(frozen=True, slots=True)
class SpotRef:
    """An immutable snapshot naming one incarnation of a Spot (used to close exactly it)."""

    spot_id: str
    object_generation: int
    mesh_name: str
    node_rid: str

    def __post_init__(self) -> None:
        gen = self.object_generation
        if type(gen) is not int or not 1 <= gen <= _MAX_GENERATION:
            raise InvalidArgument(f"object_generation is 1..2**63-1, got {gen!r}")

    def to_json_dict(self) -> dict[str, str]:
        """JSON form: the generation is a decimal string (seed: JSON decimal string)."""
        return {
            "spot_id": self.spot_id,
            "object_generation": str(self.object_generation),
            "mesh_name": self.mesh_name,
            "node_rid": self.node_rid,
        }


@dataclass(frozen=True, slots=True)
class SpotCreateResponse:
    """What ``UserSpot.on_create`` may return: an optional reply for the creator."""

    reply: Any = None


@dataclass(frozen=True, slots=True)
class SpotCreateResult:
    """The result of ``spots.create`` / ``get_or_create``."""

    spot_id: str
    spot_ref: SpotRef
    created: bool
    reply: Any = None


@dataclass(frozen=True, slots=True)
class ActorCreateResponse:
    """What ``EntrySpot.on_create_actor`` may return: approval and an optional reply."""

    accept: bool = True
    reply: Any = None


@dataclass(frozen=True, slots=True)
class ActorCreateResult:
    """The result of ``actors.create`` / ``get_or_create``."""

    actor_id: str
    created: bool
    reply: Any = None


@dataclass(frozen=True, slots=True)
class ActorJoinResult:
    """What ``UserSpot.on_actor_join`` returns: accept (default) or reject, with a reply."""

    accept: bool = True
    reply: Any = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ActorJoinCompletion:
    """Delivered to the moved Actor's ``on_join_completed`` (execution-model §5)."""

    joined: bool
    spot_id: str
    reply: Any = None
    error: ZLinkError | None = None


class RelocationReadyStatus(IntEnum):
    """How an ``APPLICATION_SIGNALED`` readiness boundary ended (kotlin-spot-interface)."""

    CONTINUED = 0  # on the source: no move was waiting, or the move did not happen
    RELOCATED = 1  # on the target: the Spot moved here; authority is committed


@dataclass(frozen=True, slots=True)
class SpotRelocationReadyCompletion:
    """Delivered to ``UserSpot.on_relocation_ready_completed`` after ``relocation_ready()
    .defer()``: ``CONTINUED`` on the source (``error`` says why a waiting move failed) or
    ``RELOCATED`` on the target. It may be delivered again in recovery: be retry-safe."""

    status: RelocationReadyStatus
    node_id: str
    error: ZLinkError | None = None


class UserSpot:
    """A User Spot: created by id, SPOT_WIDE (default) or PER_ACTOR, may hold Actors."""

    def __init__(self, context: SpotContext) -> None:
        self.context = context

    def on_create(self, request: Message | None) -> Maybe[SpotCreateResponse | None]:
        """The first callback of a new Spot; may answer the creator."""
        return None

    def on_initialize(self) -> Maybe[None]:
        """After ``on_create``, before any application message."""

    def on_closing(self, closing: SpotClosingContext) -> Maybe[None]:
        """Before the Spot goes away; its member Actors have already left."""

    def on_actor_join(self, actor_id: str, request: Message | None) -> Maybe[ActorJoinResult]:
        """Accept or reject an Actor's Join; accepts by default."""
        return ActorJoinResult()

    def on_joined_actor(self, actor: Actor) -> Maybe[None]:
        """An Actor has joined."""

    def on_leave_actor(self, actor: Actor) -> Maybe[None]:
        """An Actor has left (back to its Entry Spot)."""

    def on_relocation_ready_completed(
        self, completion: SpotRelocationReadyCompletion
    ) -> Maybe[None]:
        """After ``relocation_ready().defer()`` (APPLICATION_SIGNALED): held messages and
        timers wait for this. The default does nothing."""
        return None


class EntrySpot:
    """An Entry Spot: where new Actors of its type are created; each Actor has its own gate."""

    def __init__(self, context: EntrySpotContext) -> None:
        self.context = context

    def on_initialize(self) -> Maybe[None]:
        """When the node starts this Entry Spot."""

    def on_closing(self, closing: SpotClosingContext) -> Maybe[None]:
        """Before the Entry Spot goes away (node shutdown)."""

    def on_create_actor(
        self, actor: Actor, request: Message | None
    ) -> Maybe[ActorCreateResponse | None]:
        """Approve (default) or refuse a new Actor; may answer the creator."""
        return None

    def on_joined_actor(self, actor: Actor) -> Maybe[None]:
        """An Actor came back from a User Spot."""


class InstanceSpot:
    """An Instance Spot: activated by its first message; holds no Actors."""

    def __init__(self, context: InstanceSpotContext) -> None:
        self.context = context

    def on_initialize(self) -> Maybe[None]:
        """Before the first message is handled."""

    def on_closing(self, closing: SpotClosingContext) -> Maybe[None]:
        """Before the Instance Spot goes away (self-close, eviction or shutdown)."""


class Actor:
    """An Actor: lives in its Entry Spot, may Join a User Spot."""

    def __init__(self, context: ActorContext) -> None:
        self.context = context

    @property
    def actor_id(self) -> str:
        """This Actor's id."""
        return self.context.actor_id

    def on_join_completed(self, completion: ActorJoinCompletion) -> Maybe[None]:
        """The outcome of this Actor's deferred Join (execution-model §5)."""
