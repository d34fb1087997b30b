"""The classes an application subclasses (python-api §2, §3).

Every callback is optional and may be ``def`` or ``async def``. Spot, Actor and Channel classes
are constructed by the framework as ``Cls(context)``; the base ``__init__`` keeps the context as
``self.context``. The values the callbacks exchange live in ``zlink.types``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .types import (
    ActorCreateResponse,
    ActorJoinCompletion,
    ActorJoinResult,
    Maybe,
    SpotClosingContext,
    SpotCreateResponse,
    SpotRelocationReadyCompletion,
)

if TYPE_CHECKING:
    from .messaging.context import ActorContext, EntrySpotContext, InstanceSpotContext, SpotContext
    from .messaging.message import Message


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
        """Before the Spot goes away; its member Actors have already left, but at a node's
        shutdown (``HOST_SHUTDOWN``), where they stay put."""

    def on_actor_join(self, actor_id: str, request: Message | None) -> Maybe[ActorJoinResult]:
        """Accept or reject an Actor's Join; accepts by default."""
        return ActorJoinResult()

    def on_joined_actor(self, actor: Actor) -> Maybe[None]:
        """An Actor has joined."""

    def on_leave_actor(self, actor: Actor) -> Maybe[None]:
        """An Actor has left (back to its Entry Spot)."""

    def on_disconnect_actor(self, actor: Actor) -> Maybe[None]:
        """A member Actor is ending (``context.disconnect()``, or this Spot's
        ``disconnect_actor``): nothing of it runs after this."""

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

    def on_leave_actor(self, actor: Actor) -> Maybe[None]:
        """An Actor left this Entry Spot for a User Spot it joined."""

    def on_disconnect_actor(self, actor: Actor) -> Maybe[None]:
        """An Actor in this Entry Spot (one that joined no User Spot) is ending: nothing of
        it runs after this."""


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
