"""Value types and enums that every layer shares: a leaf (imports only ``zlink.errors``).

Identity (``SpotRef``, ``SpotKind``), results and responses of callbacks, the reasons and
statuses the seeds number (kotlin-spot-interface), and the registration enums
(``ExecutionMode``, ``RelocationCoordination``, python-api §2). Nothing here runs or locks.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from enum import Enum, IntEnum, StrEnum
from typing import Any, TypeAlias, TypeVar

from .errors import InvalidArgument, ZLinkError


class SpotKind(IntEnum):
    """The kinds of Spot, with the contract values of the seed (kotlin-spot-interface)."""

    INVALID = 0
    ENTRY = 1
    USER = 2
    INSTANCE = 3


class SpotCloseReason(IntEnum):
    """Why a Spot is closing, with the contract values of the seed.

    ``RELOCATION_OUT`` is one of those values, and no ``on_closing`` hears it: a move calls
    no callback on its source (kotlin-spot-interface: infrastructure relocation calls no
    relocation callback); the Spot goes on, with its state, on the target."""

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
        for name in ("spot_id", "mesh_name", "node_rid"):  # (a list here was a TypeError later)
            if not isinstance(getattr(self, name), str):
                raise InvalidArgument(f"{name} is a str, got {getattr(self, name)!r}")

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


class ExecutionMode(Enum):
    """How a User Spot's callbacks share execution rights (execution-model §2)."""

    SPOT_WIDE = "spot_wide"  # one gate for the Spot, its member Actors, timers, lifecycle
    PER_ACTOR = "per_actor"  # a gate per Actor, for the Spot itself, and per timer


class RelocationCoordination(Enum):
    """Who decides when a Spot may move (kotlin-spot-interface, relocation)."""

    FRAMEWORK_MANAGED = "framework_managed"
    APPLICATION_SIGNALED = "application_signaled"


class TargetKind(StrEnum):
    """What a call or a Location Store entry names (a ``str``: its value is the wire form)."""

    SPOT = "spot"
    ACTOR = "actor"
    CHANNEL = "channel"  # calls only
    TOPIC = "topic"  # Logical Multicast publish; calls only


class RelocationPolicy(Enum):
    """What a move does with an object's state (``zlink.Relocation``, python-api §2)."""

    PRESERVE_STATE = "preserve_state"  # captured on the source, restored on the target
    RECREATE = "recreate"  # a fresh instance on the target
    DISABLED = "disabled"  # never moves
