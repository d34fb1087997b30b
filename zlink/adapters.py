"""State adapters for relocation (kotlin-spot-interface, relocation paragraphs).

Moving a Spot between nodes (seal, barrier, capture, chunked transfer, restore, commit) is
``zlink.relocation``'s; what is here is the adapter contract the factory registers and the node
validates at start, and ``JsonStateAdapter``, the ready adapter for plain state.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from .errors import InvalidOperation, StateIncompatible
from .messaging import codec


@runtime_checkable
class RelocationAdapter(Protocol):
    """Captures a Spot's or Actor's state as opaque bytes and restores it into a fresh instance.

    ``capture`` must return ``bytes`` (empty bytes are a valid state). ``restore`` receives a
    fresh defensive copy every call and must not keep it; it may be called again for the same
    attempt, so it must be retry-safe.
    """

    def capture(self, instance: Any) -> bytes: ...

    def restore(self, instance: Any, data: bytes) -> None: ...


class JsonStateAdapter:
    """Plain state as JSON: the instance's public attributes, or those named in ``fields``.

    The context and callables are never captured. A value JSON cannot carry makes ``capture``
    raise ``StateIncompatible`` (the source then stays authoritative).
    """

    fields: tuple[str, ...] | None = None

    def _names(self, instance: Any) -> list[str]:
        if self.fields is not None:
            return list(self.fields)
        return [
            k for k, v in vars(instance).items()
            if not k.startswith("_") and k != "context" and not callable(v)
        ]  # fmt: skip

    def capture(self, instance: Any) -> bytes:
        state = {name: getattr(instance, name) for name in self._names(instance)}
        try:
            return codec.dumps(state)
        except TypeError as exc:
            raise StateIncompatible(
                f"state of {type(instance).__name__} is not JSON: {exc}"
            ) from exc

    def restore(self, instance: Any, data: bytes) -> None:
        if not data:
            return  # empty bytes: a valid, empty state
        try:
            state = codec.loads(bytes(data))
        except ValueError as exc:
            raise StateIncompatible(
                f"state for {type(instance).__name__} is not JSON: {exc}"
            ) from exc
        for name, value in state.items():
            setattr(instance, name, value)


def validate_adapter(adapter: type, owner: str) -> None:
    """At ``Node.start()``: the adapter must be a class with ``capture`` and ``restore``."""
    if not isinstance(adapter, type):
        raise InvalidOperation(f"{owner}: the relocation adapter must be a class, got {adapter!r}")
    missing = [m for m in ("capture", "restore") if not callable(getattr(adapter, m, None))]
    if missing:
        raise InvalidOperation(f"{owner}: adapter {adapter.__qualname__} lacks {missing}")
