"""Contexts, the route client and the Spot/Actor managers (python-api §4, §6).

A context is made once per activation and handed to ``Cls(context)``. Everything here only
builds calls or registers intents; the runtime (``zlink.runtime.runtime``) carries them out.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, ParamSpec, Protocol, TypeVar

from ..errors import InvalidArgument, InvalidOperation
from ..types import ActorCreateResult, SpotCreateResult, SpotKind, SpotRef, TargetKind
from .calls import (
    BatchSendCall,
    CreateCall,
    JoinCall,
    RelocationReadyCall,
    RequestCall,
    SendCall,
    WatchedBatchSendCall,
    WatchedCreateCall,
    WatchedJoinCall,
    WatchedRequestCall,
    WatchedSendCall,
    WatchedWorkerCall,
    WorkerCall,
    check_id,
)
from .message import Message, Request, wire_bytes

R = TypeVar("R")  # the reply type of a Request[R], the result of a worker function
P = ParamSpec("P")

_SPOT, _ACTOR = TargetKind.SPOT, TargetKind.ACTOR
_CHANNEL, _TOPIC = TargetKind.CHANNEL, TargetKind.TOPIC


class _HasActorContext(Protocol):
    """An Actor instance, as a Spot's context names it (``zlink.bases.Actor``)."""

    @property
    def context(self) -> ActorContext: ...


if TYPE_CHECKING:
    from ..timers import TimerManager
    from .port import RuntimePort as Runtime


_KIND: dict[type, bool] = {}  # message class -> is it a Request


def _messages(msgs: Iterable[object]) -> list[Message]:
    if isinstance(msgs, (str, bytes, Message)) or not isinstance(msgs, Iterable):
        raise InvalidArgument(f"a batch is an iterable of zlink.Message, got {type(msgs).__name__}")
    out: list[Message] = list(msgs)  # type: ignore[arg-type]  # checked just below
    if not out:
        raise InvalidArgument("a batch holds at least one message")
    kinds = _KIND
    for tp in set(map(type, out)):  # each type is checked once: a batch is mostly one type
        if kinds.get(tp) is not False:
            _message(next(m for m in out if type(m) is tp), False)  # registers it, or raises
    return out


def _message(msg: object, request: bool) -> Message:
    is_request = _KIND.get(type(msg))
    if is_request is request:
        return msg  # type: ignore[return-value]
    if is_request is None and isinstance(msg, Message):
        _KIND[type(msg)] = isinstance(msg, Request)
        return _message(msg, request)
    if not isinstance(msg, Message):
        raise InvalidArgument(f"a payload is a zlink.Message, got {type(msg).__name__}")
    if request and not isinstance(msg, Request):
        raise InvalidArgument(
            f"{type(msg).__qualname__} is one-way; requests take a zlink.Request[T]"
        )
    if not request and isinstance(msg, Request):
        raise InvalidArgument(
            f"{type(msg).__qualname__} is a request; send it with a request_* method"
        )
    return msg


class MessageContext:
    """What a handler may learn of the message it handles (its optional second parameter)."""

    __slots__ = ("is_request", "metadata", "sender", "topic")

    def __init__(
        self,
        metadata: Mapping[str, str],
        sender: str | None,
        is_request: bool,
        topic: str | None = None,
    ) -> None:
        self.metadata = metadata
        self.sender = sender
        self.is_request = is_request
        self.topic = topic  # the Logical Multicast topic, for a subscription handler


class RouteClient:
    """Builds calls to Spots, Actors and Channels (``context.outbound``, ``node.client()``)."""

    __slots__ = ("_rt",)

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt

    def send_to_spot(self, spot_id: str, msg: Message) -> SendCall:
        """A one-way message to a Spot."""
        if type(spot_id) is not str or not (spot_id.isascii() and 0 < len(spot_id) <= 255):
            spot_id = check_id("spot_id", spot_id)  # else surely valid: check_id's fast path
        if _KIND.get(type(msg)) is not False:  # a one-way type seen before needs no check
            msg = _message(msg, False)
        return WatchedSendCall(self._rt, _SPOT, spot_id, msg)

    def request_to_spot(self, spot_id: str, req: Request[R]) -> RequestCall[R]:
        """A request to a Spot; its reply is the ``R`` of a ``Request[R]``."""
        return WatchedRequestCall(
            self._rt, _SPOT, check_id("spot_id", spot_id), _message(req, True)
        )

    def send_to_actor(self, actor_id: str, msg: Message) -> SendCall:
        """A one-way message to an Actor (always into the Actor's own queue, §2)."""
        if type(actor_id) is not str or not (actor_id.isascii() and 0 < len(actor_id) <= 255):
            actor_id = check_id("actor_id", actor_id)  # as in send_to_spot
        if _KIND.get(type(msg)) is not False:  # a one-way type seen before needs no check
            msg = _message(msg, False)
        return WatchedSendCall(self._rt, _ACTOR, actor_id, msg)

    def request_to_actor(self, actor_id: str, req: Request[R]) -> RequestCall[R]:
        """A request to an Actor."""
        return WatchedRequestCall(
            self._rt, _ACTOR, check_id("actor_id", actor_id), _message(req, True)
        )

    def send(self, channel: str, msg: Message) -> SendCall:
        """A one-way message to a Channel."""
        return WatchedSendCall(
            self._rt, _CHANNEL, check_id("channel", channel), _message(msg, False)
        )

    def request(self, channel: str, req: Request[R]) -> RequestCall[R]:
        """A request to a Channel; its records pass the Channel's gate in order."""
        return WatchedRequestCall(
            self._rt, _CHANNEL, check_id("channel", channel), _message(req, True)
        )

    def send_many_to_spot(self, spot_id: str, msgs: Iterable[Message]) -> BatchSendCall:
        """One-way messages to a Spot, admitted together: each is still its own turn, in
        order; the batch costs one admission and one wake-up (the batch send path)."""
        return WatchedBatchSendCall(self._rt, _SPOT, check_id("spot_id", spot_id), _messages(msgs))

    def send_many_to_actor(self, actor_id: str, msgs: Iterable[Message]) -> BatchSendCall:
        """One-way messages to an Actor, admitted together (see ``send_many_to_spot``)."""
        return WatchedBatchSendCall(
            self._rt, _ACTOR, check_id("actor_id", actor_id), _messages(msgs)
        )

    def publish(self, topic: str, event: Message) -> SendCall:
        """A Logical Multicast event to every Spot subscribed to ``topic``, on every node of
        the mesh (no Yield, §16).

        Each subscriber gets it in its Spot queue, once; one whose lane is full misses it
        (counted as ``publish_dropped``; a node whose outbox is full, as
        ``publish_dropped_outbox_full``), which never fails the publish for the others.
        """
        return WatchedSendCall(self._rt, _TOPIC, check_id("topic", topic), _message(event, False))


class WorkerManager:
    """``context.workers``: run blocking or CPU-bound work off the gate (bounded pools)."""

    __slots__ = ("_rt",)

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt

    def io(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> WorkerCall[R]:
        """Blocking work (files, sockets, a database driver) on the I/O pool."""
        return WatchedWorkerCall(self._rt, "io", fn, args, kwargs)

    def cpu(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> WorkerCall[R]:
        """CPU-bound work on the CPU pool (one thread per core; parallel on 3.13t)."""
        return WatchedWorkerCall(self._rt, "cpu", fn, args, kwargs)


class SpotManager:
    """Creates User Spots (python-api §6); Entry Spot ids are the framework's own."""

    __slots__ = ("_rt",)

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt

    def create(self, spot_type: str) -> CreateCall[SpotCreateResult]:
        """A new User Spot of ``spot_type`` with a generated id."""
        return WatchedCreateCall(self._rt, _SPOT, check_id("spot_type", spot_type), None, False)

    def get_or_create(self, spot_id: str, spot_type: str) -> CreateCall[SpotCreateResult]:
        """The User Spot ``spot_id``, created as ``spot_type`` if it does not exist."""
        check_id("spot_id", spot_id)
        return WatchedCreateCall(self._rt, _SPOT, check_id("spot_type", spot_type), spot_id, True)

    def close(self, spot_ref: SpotRef) -> bool:
        """Close exactly the incarnation ``spot_ref`` names; returns once the close is begun.

        ``False`` if no such Spot; ``InvalidOperation`` on a generation mismatch or for a
        Spot that is not a User Spot; ``Unavailable`` if it is already sealed (closing).
        """
        return self._rt.close_ref(spot_ref)


class ActorManager:
    """Creates Actors in the Entry Spot registered for their type (python-api §6)."""

    __slots__ = ("_rt",)

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt

    def create(
        self, actor_type: str, *, actor_id: str | None = None
    ) -> CreateCall[ActorCreateResult]:
        """A new Actor; ``actor_id`` may be given, else one is generated."""
        if actor_id is not None:
            check_id("actor_id", actor_id)
        return WatchedCreateCall(
            self._rt, _ACTOR, check_id("actor_type", actor_type), actor_id, False
        )

    def get_or_create(self, actor_id: str, actor_type: str) -> CreateCall[ActorCreateResult]:
        """The Actor ``actor_id``, created as ``actor_type`` if it does not exist."""
        check_id("actor_id", actor_id)
        return WatchedCreateCall(
            self._rt, _ACTOR, check_id("actor_type", actor_type), actor_id, True
        )


class Client(RouteClient):
    """What ``node.client()`` returns: the route client plus the managers."""

    __slots__ = ("actors", "spots")

    def __init__(self, rt: Runtime) -> None:
        super().__init__(rt)
        self.spots = SpotManager(rt)
        self.actors = ActorManager(rt)


class _Context:
    __slots__ = ("_rt", "outbound", "spots", "timers", "workers")

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        helpers = _HELPERS.get(rt)
        if helpers is None:  # they hold only the runtime: one set per node serves every context
            helpers = _HELPERS[rt] = (RouteClient(rt), SpotManager(rt), WorkerManager(rt))
        self.outbound, self.spots, self.workers = helpers
        self.timers: TimerManager = None  # type: ignore[assignment]  # set by the activation


_HELPERS: weakref.WeakKeyDictionary[Runtime, tuple[RouteClient, SpotManager, WorkerManager]] = (
    weakref.WeakKeyDictionary()
)


class SpotContext(_Context):
    """The context of a User Spot."""

    __slots__ = ("kind", "spot_id", "spot_ref")

    def __init__(self, rt: Runtime, spot_id: str, spot_ref: SpotRef, kind: SpotKind) -> None:
        super().__init__(rt)
        self.spot_id = spot_id
        self.spot_ref = spot_ref
        self.kind = kind

    def subscribe(self, topic: str) -> None:
        """Receive events published to ``topic`` (through ``@zlink.subscription`` handlers)."""
        self._rt.subscribe(self.spot_ref, check_id("topic", topic), True)

    def unsubscribe(self, topic: str) -> None:
        """Stop receiving ``topic``; a no-op if not subscribed."""
        self._rt.subscribe(self.spot_ref, check_id("topic", topic), False)

    def leave_actor(self, actor: _HasActorContext) -> None:
        """Send a member Actor back to its Entry Spot (after this turn's queue position)."""
        self._rt.leave(_actor_id("leave_actor", actor), self.spot_id)

    def disconnect_actor(self, actor: _HasActorContext) -> None:
        """End a member Actor after its current turn: ``on_disconnect_actor`` here, then it
        is gone (what was queued for it discarded and counted)."""
        self._rt.disconnect(_actor_id("disconnect_actor", actor), self.spot_id)

    def relocation_ready(self) -> RelocationReadyCall:
        """A boundary for an ``APPLICATION_SIGNALED`` move; end it with ``.defer()``."""
        return RelocationReadyCall(self._rt, self.spot_id)


class EntrySpotContext(SpotContext):
    """The context of an Entry Spot."""

    __slots__ = ()

    def join(
        self, actor: _HasActorContext, target_spot_id: str, request: Message | None = None
    ) -> JoinCall:
        """Join one of this Entry Spot's Actors into a User Spot; end it with ``.defer()``."""
        check_id("target_spot_id", target_spot_id)
        actor_id = _actor_id("join", actor)
        return WatchedJoinCall(self._rt, actor_id, target_spot_id, _join_request(request))


def _actor_id(what: str, actor: object) -> str:
    """The id of ``actor``, an Actor a callback was given; ``InvalidArgument`` for anything
    else (an id string, ``None``: python-api §5)."""
    actor_id = getattr(getattr(actor, "context", None), "actor_id", None)
    if not isinstance(actor_id, str):
        raise InvalidArgument(
            f"{what} takes an Actor (one a callback was given), got {type(actor).__name__}"
        )
    return actor_id


def _join_request(request: object) -> Message | None:
    """A Join's request: ``None`` or a Message with a JSON form (it crosses to another node
    when the room lives there: found later, it stranded the Actor), checked now (§1)."""
    if request is None:
        return None
    if not isinstance(request, Message):
        raise InvalidArgument(f"a join request is a zlink.Message, got {type(request).__name__}")
    wire_bytes(request)  # InvalidArgument for one JSON cannot carry
    return request


class InstanceSpotContext(SpotContext):
    """The context of an Instance Spot."""

    __slots__ = ()

    def subscribe(self, topic: str) -> None:
        """Instance Spots do not take Logical Multicast (guide §1): ``InvalidOperation``."""
        raise InvalidOperation("an Instance Spot cannot subscribe to Logical Multicast")

    def close(self) -> None:
        """Close this Instance Spot after the current turn (self-close); idempotent."""
        self._rt.close_self(self.spot_id)


class ActorContext(_Context):
    """The context of an Actor."""

    __slots__ = ("actor_id", "actor_type")

    def __init__(self, rt: Runtime, actor_id: str, actor_type: str) -> None:
        super().__init__(rt)
        self.actor_id = actor_id
        self.actor_type = actor_type

    @property
    def spot_id(self) -> str:
        """The Spot this Actor belongs to now (its Entry Spot or a joined User Spot)."""
        return self._rt.actor_spot_id(self.actor_id)

    def join(self, target_spot_id: str, request: Message | None = None) -> JoinCall:
        """Join a User Spot after this handler ends normally; end it with ``.defer()`` (§5)."""
        check_id("target_spot_id", target_spot_id)
        return WatchedJoinCall(self._rt, self.actor_id, target_spot_id, _join_request(request))

    def leave(self) -> None:
        """Leave the current User Spot and return to the Entry Spot."""
        self._rt.leave(self.actor_id, None)

    def disconnect(self) -> None:
        """End this Actor after the current turn (a session that ended): the Spot it is in
        gets ``on_disconnect_actor``, what is queued for it is discarded and counted, and it
        is gone (a call for it meets ``NotFound``)."""
        self._rt.disconnect(self.actor_id, None)


class ChannelContext(_Context):
    """The context of a Channel (stateless: one instance per node serves every request)."""

    __slots__ = ("name",)

    def __init__(self, rt: Runtime, name: str) -> None:
        super().__init__(rt)
        self.name = name
