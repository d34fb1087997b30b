"""``@zlink.handler`` and the resolution of a handler's message type (python-api §3).

A handler is a method whose first parameter after ``self`` is annotated with a ``Message``
subclass; an optional second parameter receives the ``MessageContext``. Errors in a handler's
shape are ``InvalidOperation`` at decoration when they can be seen there, else at
``Node.start()`` (a forward reference that only resolves once the module is complete).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from .errors import InvalidOperation
from .messaging.message import Message, is_request, reply_type

F = TypeVar("F", bound=Callable[..., Any])
_MARK = "__zlink_handler__"
_SUB_MARK = "__zlink_subscription__"


def handler(fn: F) -> F:
    """Mark a method as the handler of the message type its first parameter is annotated with.

    ``def`` handlers run to completion on a worker; ``async def`` handlers are stepped by the
    runtime across threads (execution-model §4). A request handler returns its reply.
    """
    if not inspect.isfunction(fn):
        raise InvalidOperation(f"@zlink.handler decorates a function, not {fn!r}")
    _positional(fn)  # shape errors that need no annotations show at decoration
    setattr(fn, _MARK, True)
    return fn


def subscription(fn: F) -> F:
    """Mark a method as the handler of a Logical Multicast event type (guide §1).

    The Spot receives events published to topics it joined with ``context.subscribe(topic)``;
    they go to the Spot queue, like its other payloads. Instance Spots cannot subscribe.
    """
    if not inspect.isfunction(fn):
        raise InvalidOperation(f"@zlink.subscription decorates a function, not {fn!r}")
    _positional(fn)
    setattr(fn, _SUB_MARK, True)
    return fn


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """A resolved handler: the function, its message type and how to call it."""

    fn: Callable[..., Any]
    message_type: type[Message]
    wants_context: bool
    reply_type: Any
    is_request: bool
    is_async: bool = False  # an ``async def``: a batch cannot run it inline


def _positional(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    params = list(inspect.signature(fn).parameters.values())
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    pos = [p for p in params if p.kind in kinds]
    required_kw = [
        p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is p.empty
    ]
    name = getattr(fn, "__qualname__", repr(fn))
    if len(pos) < 2:
        raise InvalidOperation(f"handler {name} must take (self, message[, context])")
    if (len(pos) > 3 and any(p.default is p.empty for p in pos[3:])) or required_kw:
        raise InvalidOperation(f"handler {name} has parameters the runtime cannot fill")
    return pos


def resolve(fn: Callable[..., Any]) -> HandlerSpec:
    """Resolve a marked handler's message type; ``InvalidOperation`` when it has none."""
    pos = _positional(fn)
    name = getattr(fn, "__qualname__", repr(fn))
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:  # NameError for an unresolvable forward reference, and kin
        raise InvalidOperation(f"handler {name}: cannot resolve annotations: {exc}") from exc
    msg_type = hints.get(pos[1].name)
    if not (isinstance(msg_type, type) and issubclass(msg_type, Message)):
        raise InvalidOperation(
            f"handler {name}: parameter {pos[1].name!r} must be annotated with a "
            f"zlink.Message subclass, got {msg_type!r}"
        )
    req = is_request(msg_type)
    return HandlerSpec(
        fn, msg_type, len(pos) >= 3, reply_type(msg_type) if req else None, req,
        inspect.iscoroutinefunction(fn),
    )  # fmt: skip


def collect(cls: type, subscriptions: bool = False) -> dict[type[Message], HandlerSpec]:
    """All handlers (or subscription handlers) of ``cls`` by message type; no duplicates."""
    mark = _SUB_MARK if subscriptions else _MARK
    found: dict[type[Message], HandlerSpec] = {}
    seen: set[str] = set()
    for klass in cls.__mro__:
        for attr, fn in vars(klass).items():
            if attr in seen or not getattr(fn, mark, False):
                continue
            seen.add(attr)  # a subclass's override hides the base's method of the same name
            spec = resolve(fn)
            prior = found.get(spec.message_type)
            if prior is not None:
                raise InvalidOperation(
                    f"{cls.__qualname__}: two handlers for {spec.message_type.__qualname__}: "
                    f"{prior.fn.__name__} and {fn.__name__}"
                )
            found[spec.message_type] = spec
    return found
