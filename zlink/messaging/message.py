"""``Message`` and ``Request[T]``: frozen pydantic models with a wire name (python-api §1).

A payload is validated once, when it is built; the runtime never validates a built message
again (hot path). Its wire form is JSON bytes from pydantic's serializer. What lane admission
reserves for it (execution-model §7, the payload's bytes) is ``lane_size``: the length of that
form where it is cheap to know, else a bound it never exceeds, so the byte limit holds without
serializing a message that never leaves the process (issue "Performance", target 1).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from functools import cache
from typing import Any, ClassVar, ForwardRef, Generic, TypeVar, Union, get_args, get_origin
from weakref import ref

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

from ..errors import InvalidArgument, InvalidOperation, NotFound
from . import codec

T = TypeVar("T")

_BY_WIRE_NAME: dict[str, type[Message]] = {}
_PENDING_NAMES: dict[type, str | None] = {}


class Message(BaseModel):
    """A one-way payload. Subclass it; name it on the wire with ``type_name="..."``.

    The default wire name is ``module.QualName``. Two classes may not share a wire name.
    """

    model_config = ConfigDict(frozen=True)
    zlink_type_name: ClassVar[str] = "zlink.Message"

    def __init__(self, /, **data: Any) -> None:
        try:  # what BaseModel.__init__ does, without its frame (a message per send: hot)
            self.__pydantic_validator__.validate_python(data, self_instance=self)
        except ValidationError as exc:  # python-api §1: refused at the sender, typed
            raise InvalidArgument(f"invalid {type(self).__qualname__}: {exc}") from exc

    # It builds what BaseModel.__init__ builds: pydantic may make a message from JSON or a
    # dict without calling it (else each decoded message was validated twice, 2 -> 1 us).
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    def __init_subclass__(cls, type_name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _PENDING_NAMES[cls] = type_name  # read once pydantic has finished the class

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        type_name = _PENDING_NAMES.pop(cls, None)
        if cls.__pydantic_generic_metadata__["origin"] is not None:
            return  # a parametrization such as Request[Card] is not a message type of its own
        name = type_name or f"{cls.__module__}.{cls.__qualname__}"
        if not isinstance(name, str) or not 0 < _utf8_size(name) <= 255:
            raise InvalidArgument(
                f"a message wire name is 1..255 bytes of valid UTF-8, got {name!r}"
            )
        cls.zlink_type_name = name
        prior = _BY_WIRE_NAME.get(name)
        if prior is not None and (prior.__module__, prior.__qualname__) != (
            cls.__module__,
            cls.__qualname__,
        ):  # (the same class made again, a module reloaded, keeps its name)
            raise InvalidOperation(
                f"wire name {name!r} is taken by {prior.__module__}.{prior.__qualname__}"
            )
        _BY_WIRE_NAME[name] = cls


def _utf8_size(text: str) -> int:
    """Bytes of ``text`` in UTF-8; -1 if it has no UTF-8 form (a lone surrogate)."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return -1


class Request(Message, Generic[T]):
    """A payload that expects a reply of type ``T``: ``class GetCard(Request[Card]): ...``."""


def message_type(wire_name: str) -> type[Message]:
    """The message class registered under ``wire_name``; ``NotFound`` if there is none."""
    try:
        return _BY_WIRE_NAME[wire_name]
    except KeyError:
        raise NotFound(f"no message type is registered as {wire_name!r}") from None


def reply_type(request_cls: type[Message]) -> Any:
    """The ``T`` of a ``Request[T]`` subclass, or ``None`` for a one-way ``Message``.

    A forward reference (``Request["Card"]``) is resolved in the request's module; one that
    does not resolve is ``InvalidOperation`` (so registration, not the first reply, fails).
    """
    for base in request_cls.__mro__:
        meta = getattr(base, "__pydantic_generic_metadata__", None)
        if meta and meta["origin"] is Request and meta["args"]:
            return _resolve(meta["args"][0], request_cls)
    return None


def _resolve(tp: Any, owner: type) -> Any:
    if isinstance(tp, str):
        tp = ForwardRef(tp)
    if not isinstance(tp, ForwardRef):
        return tp
    namespace = vars(sys.modules[owner.__module__])
    try:
        return eval(tp.__forward_arg__, namespace)
    except Exception as exc:
        raise InvalidOperation(
            f"reply type {tp.__forward_arg__!r} of {owner.__qualname__} does not resolve: {exc}"
        ) from exc


def is_request(cls: type[Message]) -> bool:
    """Whether ``cls`` is a ``Request[T]``."""
    return issubclass(cls, Request)


def wire_bytes(msg: Message) -> bytes:
    """The wire form of ``msg``: JSON bytes. ``InvalidArgument`` for a message JSON cannot
    carry (a lone surrogate in a str, say), before anything is queued (python-api §1)."""
    try:
        return msg.__pydantic_serializer__.to_json(msg)
    except PydanticSerializationError as exc:
        raise InvalidArgument(f"{type(msg).__qualname__} has no JSON form: {exc}") from None


def _dead() -> None:
    return None


_LAST_SIZE: tuple[Callable[[], Message | None], int] = (_dead, 0)


def wire_size(msg: Message) -> int:
    """Bytes ``msg`` takes on the wire; what lane admission reserves for it (§7).

    A message is frozen, so the size of the one sent last is kept: sending one instance to
    many targets, or many times, serializes it once. The one-entry cache names that message
    by a weak reference, so it never keeps it alive: a large message is collectable once
    its turn is over, not at the next send (a dead reference matches no message; a message
    class that takes no weak reference is simply not cached).
    """
    global _LAST_SIZE
    last = _LAST_SIZE
    if last[0]() is msg:
        return last[1]
    size = len(wire_bytes(msg))
    try:
        _LAST_SIZE = (ref(msg), size)
    except TypeError:  # a subclass with __slots__ and no __weakref__
        _LAST_SIZE = (_dead, 0)
    return size


_I64 = 1 << 63  # an int in [-2**63, 2**63) takes at most 20 bytes of JSON
# Most bytes a value of a flat field takes in JSON, and what the sample value takes.
_MOST = {bool: (5, False, 5), int: (20, 0, 1), float: (24, 0.0, 3), str: (2, "", 2)}
_NONE = 4  # null
_EXACT = -1  # a class sized by serializing each message
# per class: the bound of its JSON without its str characters (or _EXACT), its int and str fields
_PLANS: dict[type, tuple[int, tuple[str, ...], tuple[str, ...]]] = {}


def lane_size(
    msg: Message, _plans: dict[type, tuple[int, tuple[str, ...], tuple[str, ...]]] = _PLANS,
    _type: type[type] = type, _int: type[int] = int, _str: type[str] = str, _hi: int = _I64,
) -> int:  # fmt: skip
    """Bytes a local lane reserves for ``msg`` (execution-model §7): never less than its wire
    form, and exact where serializing it is the cheap way to know.

    A class whose fields are all ``bool``, ``int``, ``float``, ``str`` or one of those or
    ``None``, with no custom serializer, has a bound: its JSON with every number at its
    longest (a float's repr is at most 24 bytes, an int below 2**63 in absolute value 20),
    plus its strs counted exactly: a printable ASCII str takes its length, its quotes and a
    backslash before each ``"`` and ``\\`` (the only escapes it needs). A bigger int, a str
    with a control character or beyond ASCII (also where a lone surrogate shows: it has no
    JSON form, ``InvalidArgument`` here), and any other class are serialized and measured
    (``wire_size``).

    (The defaults bind what it reads as locals: this runs once per send, and the free-threaded
    build does not specialize global lookups.)
    """
    plan = _plans.get(_type(msg))
    if plan is None:
        plan = _learn(_type(msg))
    bound, ints, strs = plan
    if bound < 0:  # _EXACT
        return wire_size(msg)
    if ints or strs:
        values = msg.__dict__
        for name in ints:
            v = values[name]
            if v is not None and (_type(v) is not _int or not -_hi <= v < _hi):
                return wire_size(msg)
        for name in strs:
            v = values[name]
            if v is not None:
                if _type(v) is not _str or not v.isascii() or not v.isprintable():
                    return wire_size(msg)
                bound += len(v) + v.count('"') + v.count("\\")
    return bound


def _learn(tp: type[Message]) -> tuple[int, tuple[str, ...], tuple[str, ...]]:
    """Work out (once per class) whether ``tp`` has a bound, and what it is."""
    bound = _EXACT
    ints: list[str] = []
    strs: list[str] = []
    decorators = tp.__pydantic_decorators__
    if not (
        decorators.field_serializers
        or decorators.model_serializers
        or decorators.computed_fields
        or tp.model_config.get("extra") == "allow"  # extra fields go on the wire too
        or tp.__pydantic_generic_metadata__["origin"] is not None
    ):
        sample: dict[str, Any] = {}
        extra = 0
        for name, field in tp.model_fields.items():
            flat, optional = _flat(field.annotation)
            if flat is None:
                sample = {}
                break
            most, value, size = _MOST[flat]
            if optional:
                value, size = None, _NONE
                most = max(most, _NONE)
            sample[name] = value
            extra += most - size
            if flat is int:
                ints.append(name)
            elif flat is str:
                strs.append(name)
        else:
            try:
                bound = len(wire_bytes(tp.model_construct(**sample))) + extra
            except Exception:  # noqa: BLE001 - a class the sample does not fit: measured exactly
                bound = _EXACT
    plan = _PLANS[tp] = (bound, tuple(ints), tuple(strs))
    return plan


def _flat(annotation: Any) -> tuple[type | None, bool]:
    """``(bool|int|float|str, optional)`` for a flat field's annotation, else ``(None, _)``."""
    if annotation in _MOST:
        return annotation, False
    if get_origin(annotation) in (Union, types.UnionType):
        args = get_args(annotation)
        if len(args) == 2 and type(None) in args:
            inner = args[0] if args[1] is type(None) else args[1]
            if inner in _MOST:
                return inner, True
    return None, False


def lane_size_many(msgs: list[Message], tp: type[Message] | None) -> int:
    """What a local lane reserves for a batch (see ``lane_size``): for a class with a bound,
    its messages' reservations added up (``len(msgs)`` times the bound if it needs no look at
    the values), else ``wire_size_many``."""
    if tp is not None:
        plan = _PLANS.get(tp)
        if plan is None:
            plan = _learn(tp)
        bound, ints, strs = plan
        if bound != _EXACT:
            if not ints and not strs:
                return bound * len(msgs)
            return sum(map(lane_size, msgs))
    return wire_size_many(msgs, tp)


def wire_size_many(msgs: list[Message], tp: type[Message] | None) -> int:
    """Bytes of every message of a batch on the wire, added up.

    For a batch of one type (``tp``), one serializer call for the lot: JSON of a list is
    ``[`` + the items joined by ``,`` + ``]``, so the items take its length less ``n + 1``.
    """
    if tp is None or len(msgs) == 1:
        return sum(map(wire_size, msgs))
    try:
        return len(_list_adapter(tp).dump_json(msgs)) - len(msgs) - 1
    except PydanticSerializationError as exc:
        raise InvalidArgument(f"a {tp.__qualname__} of the batch has no JSON form: {exc}") from None


@cache
def _list_adapter(tp: type[Message]) -> TypeAdapter[list[Message]]:
    return TypeAdapter(list[tp])  # type: ignore[valid-type]


def decode(cls: type[Message], data: bytes | str) -> Message:
    """Validate wire bytes into ``cls``; a bad payload is ``InvalidArgument``."""
    try:
        return cls.model_validate_json(data)
    except ValidationError as exc:
        raise InvalidArgument(f"payload is not a valid {cls.zlink_type_name}: {exc}") from exc


def to_wire(msg: Message) -> tuple[str, str]:
    """``msg`` as node envelopes carry it: its wire type name and its JSON text."""
    return type(msg).zlink_type_name, wire_bytes(msg).decode()


def from_wire(type_name: str, payload: str) -> Message:
    """The message a ``to_wire`` form holds; an unknown type or a bad payload raises."""
    return decode(message_type(type_name), payload)


@cache
def _adapter(tp: Any) -> TypeAdapter[Any]:
    return TypeAdapter(tp)


def reply_from_json(tp: Any, text: str | bytes) -> Any:
    """A reply as it arrived from another node, validated as the request's ``T`` (``None``:
    plain JSON); raises on a value that does not decode as ``T``."""
    if tp is None:
        return codec.loads(text)
    return _adapter(tp).validate_json(text)


def check_reply(tp: Any, value: Any) -> Any:
    """Check a handler's reply against the request's ``T``; return what the caller receives.

    A reply that cannot be encoded as ``T`` raises ``InvalidArgument`` (a reply-encoding
    failure, execution-model §5). The check is pydantic's strict mode: an int is a valid
    ``float`` (received as a float), a bool is not a valid ``int``. An instance of ``T`` is
    taken as it is, without validation (the common case), except a bool for ``int``: bool is
    an int subclass to ``isinstance``, not to strict mode.
    """
    if tp is None or tp is Any:
        return value
    if (
        isinstance(tp, type)
        and isinstance(value, tp)
        and (tp is not int or type(value) is not bool)
    ):
        return value
    try:
        return _adapter(tp).validate_python(value, strict=True)
    except Exception as exc:  # an invalid value, or a type pydantic cannot validate at all
        raise InvalidArgument(f"reply {value!r} is not a valid {tp!r}: {exc}") from exc
