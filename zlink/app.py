"""``zlink.App``: the registry of Spot, Actor and Channel types (python-api §2).

Registration errors are ``InvalidOperation`` at decoration or at ``Node.start()`` (through
:meth:`App.validate`), never later.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .adapters import validate_adapter
from .bases import Actor, EntrySpot, InstanceSpot, UserSpot
from .errors import InvalidArgument, InvalidOperation
from .handlers import HandlerSpec, collect
from .messaging.calls import check_id
from .messaging.message import Message
from .timers import collect_timer_handlers
from .types import ExecutionMode, RelocationCoordination, RelocationPolicy, SpotKind

C = TypeVar("C", bound=type)


@dataclass(frozen=True)
class Relocation:
    """A relocation policy: ``preserve_state(Adapter)``, ``recreate()`` or ``disabled()``.

    Registration validates the policy; ``zlink.relocation`` carries it out when a Spot moves.
    """

    kind: RelocationPolicy
    adapter: type | None = None

    @staticmethod
    def preserve_state(adapter: type) -> Relocation:
        """Capture state with ``adapter`` on the source and restore it on the target."""
        if not isinstance(adapter, type):
            raise InvalidOperation(f"preserve_state takes an adapter class, got {adapter!r}")
        return Relocation(RelocationPolicy.PRESERVE_STATE, adapter)

    @staticmethod
    def recreate() -> Relocation:
        """Start a fresh instance on the target; no state moves."""
        return Relocation(RelocationPolicy.RECREATE)

    @staticmethod
    def disabled() -> Relocation:
        """This type never moves."""
        return Relocation(RelocationPolicy.DISABLED)


@dataclass
class TypeSpec:
    """A registered Spot, Actor or Channel type."""

    name: str
    cls: type
    kind: SpotKind | None  # None for Actors and Channels
    mode: ExecutionMode = ExecutionMode.SPOT_WIDE
    relocation: Relocation = field(default_factory=Relocation.disabled)
    coordination: RelocationCoordination = RelocationCoordination.FRAMEWORK_MANAGED
    actor_type: str | None = None  # an Entry Spot's Actor type; an Actor's Entry Spot type
    handlers: dict[type[Message], HandlerSpec] = field(default_factory=dict)
    timer_handlers: dict[str, Callable[..., Any]] = field(default_factory=dict)
    subscriptions: dict[type[Message], HandlerSpec] = field(default_factory=dict)


def _check_name(what: str, name: object) -> str:
    """A registered type or channel name: an id, 1..255 bytes of valid UTF-8 (python-api §5)."""
    return check_id(f"a {what} name", name)


def _has_subscriptions(cls: type) -> bool:
    return any(
        getattr(fn, "__zlink_subscription__", False)
        for klass in cls.__mro__
        for fn in vars(klass).values()
    )


def _check_marks(spec: TypeSpec, cls: type) -> None:
    """Decorators a class of this kind would ignore (python-api §2: a registration mistake is
    ``InvalidOperation``): a handler, timer handler or subscription wrapped in
    ``staticmethod``/``classmethod`` (never bound: "no handler" at the first call), and timer
    handlers or subscriptions on a Channel (stateless: it has neither) or an Actor (it takes
    no Logical Multicast)."""
    marks = ("__zlink_handler__", "__zlink_timer__", "__zlink_subscription__")
    for klass in cls.__mro__:
        for name, value in vars(klass).items():
            if isinstance(value, (staticmethod, classmethod)) and any(
                getattr(value.__func__, m, None) for m in marks
            ):
                raise InvalidOperation(
                    f"{spec.name!r}: {name} is a {type(value).__name__}; a handler is a plain "
                    "method (def or async def)"
                )
    channel = spec.kind is None and spec.actor_type is None and not issubclass(cls, Actor)
    if channel and collect_timer_handlers(cls):
        raise InvalidOperation(f"Channel {spec.name!r} is stateless: it has no timers")
    if (channel or issubclass(cls, Actor)) and _has_subscriptions(cls):
        raise InvalidOperation(f"{spec.name!r} cannot subscribe to Logical Multicast (Spots do)")


def _relocation(relocation: object) -> Relocation | None:
    """``relocation`` if it is a ``Relocation`` (or ``None``); ``InvalidOperation`` for
    anything else (``"recreate"`` failed later, at ``Node.start``, with AttributeError)."""
    if relocation is not None and not isinstance(relocation, Relocation):
        raise InvalidOperation(
            "relocation must be a Relocation (Relocation.recreate(), .preserve_state(...), "
            f".disabled()), got {relocation!r}"
        )
    return relocation


_MEMBERSHIP_CALLBACKS = (
    "on_actor_join", "on_joined_actor", "on_leave_actor", "on_create_actor", "on_disconnect_actor",
)  # fmt: skip


class App:
    """The types one ZLink application is made of."""

    def __init__(self, name: str = "zlink") -> None:
        self.name = name
        self.spots: dict[str, TypeSpec] = {}
        self.actors: dict[str, TypeSpec] = {}
        self.channels: dict[str, TypeSpec] = {}
        self._validated = False

    def user_spot(
        self,
        spot_type: str,
        *,
        mode: ExecutionMode = ExecutionMode.SPOT_WIDE,
        relocation: Relocation | None = None,
        relocation_coordination: RelocationCoordination = RelocationCoordination.FRAMEWORK_MANAGED,
    ) -> Callable[[C], C]:
        """Register a User Spot class, created by ``spots.create`` / ``get_or_create``."""
        if not isinstance(mode, ExecutionMode):
            raise InvalidOperation(f"mode must be an ExecutionMode, got {mode!r}")
        if not isinstance(relocation_coordination, RelocationCoordination):  # (a string was
            raise InvalidOperation(  # taken as FRAMEWORK_MANAGED, unseen)
                "relocation_coordination must be a RelocationCoordination, "
                f"got {relocation_coordination!r}"
            )
        relocation = _relocation(relocation)
        if relocation is None:
            relocation = (
                Relocation.recreate() if mode is ExecutionMode.PER_ACTOR else Relocation.disabled()
            )
        if mode is ExecutionMode.PER_ACTOR and relocation.kind is not RelocationPolicy.RECREATE:
            raise InvalidOperation("a PER_ACTOR User Spot accepts only Relocation.recreate()")
        if (
            relocation_coordination is RelocationCoordination.APPLICATION_SIGNALED
            and mode is not ExecutionMode.SPOT_WIDE
        ):
            raise InvalidOperation("APPLICATION_SIGNALED relocation is allowed only in SPOT_WIDE")
        spec = TypeSpec(spot_type, object, SpotKind.USER, mode, relocation, relocation_coordination)
        return self._register(self.spots, spec, UserSpot)

    def entry_spot(self, spot_type: str, *, actor: str) -> Callable[[C], C]:
        """Register an Entry Spot, where new Actors of type ``actor`` are created (§2)."""
        _check_name("actor type", actor)
        spec = TypeSpec(spot_type, object, SpotKind.ENTRY, actor_type=actor)
        return self._register(self.spots, spec, EntrySpot)

    def instance_spot(
        self, spot_type: str, *, relocation: Relocation | None = None
    ) -> Callable[[C], C]:
        """Register an Instance Spot: activated by its first message, never holds Actors."""
        spec = TypeSpec(
            spot_type, object, SpotKind.INSTANCE,
            relocation=_relocation(relocation) or Relocation.disabled(),
        )  # fmt: skip
        return self._register(self.spots, spec, InstanceSpot)

    def actor(self, actor_type: str, *, relocation: Relocation | None = None) -> Callable[[C], C]:
        """Register an Actor type; an ``entry_spot(..., actor=actor_type)`` must host it."""
        spec = TypeSpec(
            actor_type, object, None, relocation=_relocation(relocation) or Relocation.disabled()
        )
        return self._register(self.actors, spec, Actor)

    def channel(self, name: str) -> Callable[[C], C]:
        """Register a Channel: stateless named handlers, one instance per node whose records
        pass a gate of its own, in order (execution-model §2)."""
        return self._register(self.channels, TypeSpec(name, object, None), object)

    def _register(self, table: dict[str, TypeSpec], spec: TypeSpec, base: type) -> Callable[[C], C]:
        _check_name("type", spec.name)
        if spec.name in table:
            raise InvalidOperation(f"type {spec.name!r} is registered twice")

        def decorate(cls: C) -> C:
            if not isinstance(cls, type) or not issubclass(cls, base):
                raise InvalidOperation(f"{spec.name!r} must be a subclass of {base.__name__}")
            if spec.name in table:
                raise InvalidOperation(f"type {spec.name!r} is registered twice")
            if spec.kind is SpotKind.INSTANCE:
                bad = [n for n in _MEMBERSHIP_CALLBACKS if hasattr(cls, n)]
                if bad:
                    raise InvalidOperation(
                        f"Instance Spot {spec.name!r} cannot hold Actors, yet defines {bad}"
                    )
            _check_marks(spec, cls)
            spec.cls = cls
            spec.timer_handlers = collect_timer_handlers(cls)
            if spec.kind is SpotKind.INSTANCE and _has_subscriptions(cls):
                raise InvalidOperation(
                    f"Instance Spot {spec.name!r} cannot subscribe to Logical Multicast"
                )
            try:
                spec.handlers = collect(cls)
            except InvalidOperation as exc:
                if "cannot resolve annotations" not in str(exc):
                    raise
                spec.handlers = {}  # a forward reference: resolved again in validate()
            table[spec.name] = spec
            self._validated = False
            return cls

        return decorate

    def validate(self) -> None:
        """Check the whole registry (``Node.start()`` calls this); ``InvalidOperation`` if bad."""
        for table in (self.spots, self.actors, self.channels):
            for spec in table.values():
                if spec.relocation.adapter is not None:  # python-api §2: checked at start
                    validate_adapter(spec.relocation.adapter, spec.name)
                spec.handlers = collect(spec.cls)
                spec.subscriptions = collect(spec.cls, subscriptions=True)
        hosts: dict[str, str] = {}
        for spec in self.spots.values():
            if spec.kind is SpotKind.ENTRY:
                assert spec.actor_type is not None
                if spec.actor_type not in self.actors:
                    raise InvalidOperation(
                        f"Entry Spot {spec.name!r} hosts unknown Actor type {spec.actor_type!r}"
                    )
                if spec.actor_type in hosts:
                    raise InvalidOperation(
                        f"Actor type {spec.actor_type!r} has two Entry Spots: "
                        f"{hosts[spec.actor_type]!r} and {spec.name!r}"
                    )
                hosts[spec.actor_type] = spec.name
        for name, spec in self.actors.items():
            if name not in hosts:
                raise InvalidOperation(f"Actor type {name!r} has no entry_spot(..., actor=...)")
            spec.actor_type = hosts[name]
        self._validated = True

    def spot_spec(self, spot_type: str) -> TypeSpec:
        """The registered Spot type ``spot_type``; ``InvalidArgument`` if unknown."""
        spec = self.spots.get(spot_type)
        if spec is None:
            raise InvalidArgument(f"unknown spot type {spot_type!r}")
        return spec

    def describe(self) -> dict[str, Any]:
        """A plain summary of the registry (for the command line and logs)."""
        return {
            "spots": {n: s.kind.name if s.kind else "" for n, s in self.spots.items()},
            "actors": sorted(self.actors),
            "channels": sorted(self.channels),
        }
