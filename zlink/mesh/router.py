"""Routing between nodes: forward a call to the Spot's owner, carry its reply back.

Guarantees / assumes:
* A forwarded request keeps its deadline (the remaining time travels with it), its correlation
  id and its reply route (the origin node); the origin's own deadline on its infrastructure heap
  decides the caller's outcome, and a reply after it is dropped and counted (python-api §5).
* Everything a node receives is handled on its infrastructure thread: decoding, local
  submission (admission never waits), and completing the waiting call, so a reply reaches the
  waiting turn even while every application worker of that node is blocked (§13, §16).
* A node that receives a call for a Spot it no longer owns forwards it again (stale routes
  relay to the current owner).
"""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter
from pydantic_core import to_json

from .. import errors
from ..errors import HandlerError, InvalidArgument, Unavailable, ZLinkError
from ..messaging import codec
from ..messaging.calls import NO_WAIT, CreateCall, MessageCall, RequestCall, SendCall
from ..messaging.completion import Completion
from ..messaging.message import Message, message_type, reply_type
from ..objects.base import SpotCreateResult
from .location import Location, LocationStore
from .transport import Transport

if TYPE_CHECKING:
    from ..objects.runtime import Runtime

_ERRORS: dict[str, type[ZLinkError]] = {
    cls.code.value: cls
    for cls in (
        errors.InvalidOperation,
        errors.InvalidArgument,
        errors.NotFound,
        errors.Unavailable,
        errors.DeadlineExceeded,
        errors.ResourceExhausted,
        errors.StateIncompatible,
        errors.Cancelled,
    )
}
_MAX_HOPS = 8  # a route that relays more often than this is a loop


def encode_error(exc: BaseException) -> dict[str, str]:
    if isinstance(exc, HandlerError):
        return {"ec": exc.code.value, "et": exc.remote_type, "em": exc.remote_message}
    code = exc.code.value if isinstance(exc, ZLinkError) else "HANDLER_ERROR"
    return {"ec": code, "et": type(exc).__qualname__, "em": str(exc)}


def decode_error(data: dict[str, Any]) -> ZLinkError:
    if data["ec"] == "HANDLER_ERROR":
        return HandlerError(data["et"], data["em"])
    return _ERRORS.get(data["ec"], errors.Unavailable)(data["em"])


class MeshRouter:
    """One node's side of the mesh."""

    def __init__(self, rt: Runtime, store: LocationStore, transport: Transport) -> None:
        self.rt = rt
        self.store = store
        self.transport = transport
        self._pending: dict[int, tuple[Completion, Any]] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    # -- the origin side -----------------------------------------------------------------------
    def forward(
        self, call: MessageCall, reply: Completion | None, location: Location, hops: int = 0
    ) -> Completion | None:
        """Send ``call`` to the node that owns its target. Admission is the owner's affair:
        a one-way send is accepted once handed to the transport."""
        msg = call.msg
        envelope: dict[str, Any] = {
            "k": "request" if reply is not None else "send",
            "to": call.kind,
            "t": call.target,
            "tn": type(msg).zlink_type_name,
            "p": msg.__pydantic_serializer__.to_json(msg).decode(),
            "m": call.meta or {},
            "o": self.rt.node_id,
            "h": hops,
            "i": call.instance_type if call.instance else None,
            "ii": call.instance,
        }
        if reply is not None:
            envelope["c"] = self.register_pending(reply, reply_type(type(msg)))
            envelope["d"] = self.rt.deadline_of(call.deadline)  # the time travels with it
        self.transport.send(location.owner, envelope)
        return reply

    def forward_create(self, call: CreateCall[Any], completion: Completion, at: Location) -> None:
        """``get_or_create`` of a User Spot that another node owns: ask that node."""
        corr = self.register_pending(completion, SpotCreateResult)
        self.transport.send(
            at.owner,
            {"k": "create", "t": call.object_id, "tn": call.type_name, "o": self.rt.node_id,
             "c": corr, "h": 0},
        )  # fmt: skip

    def register_pending(self, completion: Completion, tp: Any) -> int:
        """Await a reply for ``completion`` under a new correlation id; forgotten once done."""
        corr = next(self._ids)
        with self._lock:
            self._pending[corr] = (completion, tp)
        completion.add_callback(lambda _v, _e: self._forget(corr))
        return corr

    def _forget(self, corr: int) -> None:
        with self._lock:
            self._pending.pop(corr, None)

    # -- the receiving side (infrastructure thread) --------------------------------------------
    def receive(self, envelope: dict[str, Any]) -> None:
        kind = envelope["k"]
        if kind == "reply":
            self._on_reply(envelope)
        elif kind.startswith("reloc"):
            relocator = self.rt.relocator
            assert relocator is not None
            {
                "reloc_chunk": relocator.on_chunk,
                "reloc": relocator.on_relocate,
                "reloc_done": relocator.on_restored,
                "reloc_commit": relocator.on_commit,
                "reloc_opened": relocator.on_opened,
            }[kind](envelope)
        elif kind == "create":
            self._on_create(envelope)
        else:
            self._on_call(envelope)

    def _on_create(self, env: dict[str, Any]) -> None:
        call: CreateCall[Any] = CreateCall(self.rt, "spot", env["tn"], env["t"], True)
        try:
            done = self.rt.submit_create(call, NO_WAIT)
        except ZLinkError as exc:
            self._reply(env, error=exc)
            return
        done.add_callback(lambda value, error: self._reply(env, value, error))

    def _on_call(self, env: dict[str, Any]) -> None:
        request = env["k"] == "request"
        try:
            cls = message_type(env["tn"])
            msg: Message = cls.model_validate_json(env["p"])
        except Exception as exc:  # noqa: BLE001 - a bad payload fails that request only
            self.rt.metrics.add("bad_wire_payloads")
            if request:
                self._reply(env, error=InvalidArgument(f"bad payload for {env['tn']}: {exc}"))
            return
        call_cls = RequestCall if request else SendCall
        call: MessageCall = call_cls(self.rt, env["to"], env["t"], msg)
        call.meta = env["m"] or None
        call.instance, call.instance_type = bool(env.get("ii")), env.get("i")
        if request:
            call.deadline = float(env["d"])
        try:
            done = self.rt.submit(call, Completion() if request else None, NO_WAIT,
                                  hops=env["h"] + 1)  # fmt: skip
        except ZLinkError as exc:
            relocator = self.rt.relocator
            moving = isinstance(exc, Unavailable) and relocator is not None
            if moving and relocator.park(env["t"], env):  # type: ignore[union-attr]
                return  # sealed for a move: it goes along to the new owner
            if request:
                self._reply(env, error=exc)
            else:
                self.rt.metrics.add("remote_sends_refused")
            return
        if request and done is not None:
            done.add_callback(lambda value, error: self._reply(env, value, error))

    def _reply(self, env: dict[str, Any], value: Any = None, error: BaseException | None = None):  # type: ignore[no-untyped-def]
        out: dict[str, Any] = {"k": "reply", "c": env["c"]}
        if error is not None:
            out["e"] = encode_error(error)
        else:
            out["v"] = to_json(value).decode()
        try:
            self.transport.send(env["o"], out)
        except Unavailable:
            self.rt.metrics.add("replies_undeliverable")

    def _on_reply(self, env: dict[str, Any]) -> None:
        with self._lock:
            entry = self._pending.pop(env["c"], None)
        if entry is None:  # timed out (or never ours): a reply never completes a call twice
            self.rt.metrics.add("late_replies")
            return
        completion, tp = entry
        if "e" in env:
            completion.set(None, decode_error(env["e"]))
            return
        try:
            value = codec.loads(env["v"]) if tp is None else _adapter(tp).validate_json(env["v"])
        except Exception as exc:  # noqa: BLE001 - the caller gets a typed error instead
            completion.set(None, InvalidArgument(f"reply does not decode as {tp!r}: {exc}"))
            return
        if not completion.set(value, None):
            self.rt.metrics.add("late_replies")


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def _adapter(tp: Any) -> TypeAdapter[Any]:
    adapter = _ADAPTERS.get(tp)
    if adapter is None:
        adapter = _ADAPTERS[tp] = TypeAdapter(tp)
    return adapter


__all__ = ["_MAX_HOPS", "MeshRouter", "decode_error", "encode_error"]
