"""Routing between nodes: forward a call to the Spot's owner, carry its reply back.

Guarantees / assumes:
* A forwarded request keeps its deadline (the remaining time travels with it), its correlation
  id and its reply route (the origin node); the origin's own deadline on its infrastructure heap
  decides the caller's outcome, and a reply after it is dropped and counted (python-api §5).
* Everything a node receives is handled on its infrastructure thread: decoding, local
  submission (admission never waits), and completing the waiting call, so a reply reaches the
  waiting turn even while every application worker of that node is blocked (§13, §16).
* A node that receives a call for a Spot it no longer owns forwards it again (stale routes
  relay to the current owner) and tells the call's origin the better route.
* Per-sender FIFO across a relocation: each node sends a remote target along one path at a
  time: its own forwarding pointer if it moved the target away, else its route cache, else the
  Location Store. A path changes only behind a fence: when a node learns a better route (a
  relaying node tells it), or the target arrives on it, it sends a fence along the old path and
  keeps its new calls for that target until the fence comes back from the owner. The fence is
  relayed, parked and flushed exactly like a call, so it reaches the owner after every call
  sent before it; only then do the kept calls leave, along the new path. Transports need only
  per-connection order.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import TYPE_CHECKING, Any, NamedTuple

from pydantic import TypeAdapter
from pydantic_core import to_json

from .. import errors
from ..errors import HandlerError, InvalidArgument, Unavailable, ZLinkError
from ..executor import ranked_lock
from ..lock_order import LockRank
from ..mesh.location import Location, LocationStore
from ..mesh.transport import Transport
from ..messaging import codec
from ..messaging.calls import NO_WAIT, CreateCall, MessageCall, RequestCall, SendCall
from ..messaging.completion import Completion
from ..messaging.message import from_wire, reply_type, to_wire
from ..types import SpotCreateResult, TargetKind
from .ports import EnvelopeHandler

if TYPE_CHECKING:
    from .runtime import Runtime

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
MAX_POINTERS = 100_000  # forwarding pointers a node keeps for Spots and Actors it moved away


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
        self._lock = ranked_lock("router.pending", LockRank.PENDING)
        self._ids = itertools.count(1)
        # routing: one path per remote target at a time (see the module docstring)
        self.route_lock = ranked_lock("router.route", LockRank.ROUTE, reentrant=True)
        self._routes: dict[str, Route] = {}  # target -> where this node sends it
        self._moved: dict[str, Route] = {}  # forwarding pointers: targets this node moved away
        self._switching: dict[str, list[dict[str, Any]]] = {}  # target -> kept behind a fence
        self._handlers: dict[str, EnvelopeHandler] = {}  # kinds the parts above handle

    def handle(self, kind: str, handler: EnvelopeHandler) -> None:
        """Have ``handler`` receive envelopes of ``kind`` (on the infrastructure thread)."""
        self._handlers[kind] = handler

    # -- routes ------------------------------------------------------------------------------
    def _known(self, target: str) -> Route | None:
        """This node's own path for ``target``: its forwarding pointer, else its route cache."""
        return self._moved.get(target) or self._routes.get(target)

    def route(self, target: str) -> Route | None:
        """Where to send ``target`` now (caller holds ``route_lock``); ``None`` if nowhere."""
        hit = self._known(target)
        if hit is not None and hit.node != self.rt.node_id:
            return hit
        found = self.store.lookup(target)
        if found is None or found.owner == self.rt.node_id:  # not here (we checked): nowhere
            self._routes.pop(target, None)
            return None
        hit = self._routes[target] = Route.at(found)
        return hit

    def moved_away(self, target: str, route: Route) -> None:
        """This node relocated ``target`` to ``route.node``: relay along it from now on.

        At most ``MAX_POINTERS`` are kept, the oldest dropped first: a call that still comes
        here for one of those is relayed by the Location Store instead (delivered, but no
        longer behind a fence, so its order with later calls is not guaranteed).
        """
        with self.route_lock:
            self._moved.pop(target, None)
            self._moved[target] = route  # the newest last: dicts keep insertion order
            self._routes.pop(target, None)
            while len(self._moved) > MAX_POINTERS:
                del self._moved[next(iter(self._moved))]
                self.rt.metrics.add("pointers_dropped")

    def arrived(self, target: str) -> None:
        """``target`` relocated onto this node: no pointer, no route; it is local now."""
        with self.route_lock:
            self._moved.pop(target, None)
            self._routes.pop(target, None)

    def send_call(self, call: MessageCall, reply: Completion | None, hops: int) -> bool:
        """Send (or keep, behind a fence) a call for a remote target; ``False`` if it has no
        location. The caller holds ``route_lock``."""
        target = call.target
        kept = self._switching.get(target)
        if kept is not None:
            kept.append(self.envelope(call, reply, hops))
            return True
        route = self.route(target)
        if route is None:
            return False
        self.transport.send(route.node, self.envelope(call, reply, hops))
        if hops:
            self.rt.metrics.add("relayed_calls")
            self.tell_origin(call.origin, target, route)
        return True

    def switch(self, target: str) -> bool:
        """Start changing ``target``'s path: a fence goes along the old one, and calls wait.

        The caller holds ``route_lock``. ``False`` if there is no old path to fence (nothing
        can be overtaken); ``fenced`` ends the switch when the fence is back.
        """
        if target in self._switching:
            return True
        route = self._known(target)
        if route is None or route.node == self.rt.node_id:
            return False
        kept: list[dict[str, Any]] = []
        self._switching[target] = kept
        self.rt.metrics.add("route_fences")
        fence = {"k": "fence", "t": target, "oo": self.rt.node_id, "h": 0}
        try:
            self.transport.send(route.node, fence)
        except Unavailable:  # the old path is gone, and what went along it with it
            del self._switching[target]
            return False
        # a fence lost with a node must not keep the calls behind it forever
        self.rt.infra.call_later(self.rt.request_timeout, self._fence_overdue, target, kept)
        return True

    def _fence_overdue(self, target: str, kept: list[dict[str, Any]]) -> None:
        """No fence came back in a request timeout: give up the old path (counted); the kept
        calls go by the Location Store. Order is kept only while the old path works."""
        with self.route_lock:
            if self._switching.get(target) is not kept:
                return  # it came back
            self.rt.metrics.add("route_fences_lost")
            self._on_fenced({"k": "fenced", "t": target, "n": None})

    def _on_route(self, env: dict[str, Any]) -> None:
        """A relaying node says where ``t`` went: a newer generation starts a fenced switch."""
        learned = Route(env["n"], (env["g"][0], env["g"][1]))
        target = env["t"]
        with self.route_lock:
            known = self._known(target)
            if known is not None and learned.generation <= known.generation:
                return
            if learned.node == self.rt.node_id:  # it is arriving here: its own fence decides
                return
            if not self.switch(target):
                self._routes[target] = learned

    def _on_fence(self, env: dict[str, Any]) -> None:
        """A fence travels like a call: parked with a moving target, relayed along the route,
        kept behind this node's own fence; at the owner it goes back to where it started."""
        target = env["t"]
        relocator = self.rt.relocator
        if relocator is not None and relocator.divert_envelope(target, env):
            return
        with self.route_lock:
            if self.rt.has_live(target):
                self._fence_back(env)
                return
            env["h"] += 1
            kept = self._switching.get(target)
            if kept is not None:
                kept.append(env)
                return
            route = self.route(target)
            if route is None or env["h"] > _MAX_HOPS:  # nowhere: the calls before it met that too
                self._fence_back(env, gone=True)
                return
            env["v"] = self.rt.node_id
            self.transport.send(route.node, env)

    def _fence_back(self, env: dict[str, Any], gone: bool = False) -> None:
        back = {"k": "fenced", "t": env["t"], "n": None if gone else self.rt.node_id}
        if env["oo"] == self.rt.node_id:
            self._on_fenced(back)
            return
        with contextlib.suppress(Unavailable):  # the origin is gone, and its calls with it
            self.transport.send(env["oo"], back)

    def _on_fenced(self, env: dict[str, Any]) -> None:
        """The fence is back: the new path is safe; the calls kept behind it go, in order."""
        target = env["t"]
        with self.route_lock:
            kept = self._switching.pop(target, None)
            if kept is None:
                return
            found = self.store.lookup(target)
            self._moved.pop(target, None)  # a pointer is a route too: the fence replaced it
            if env["n"] is not None and env["n"] != self.rt.node_id and found is not None:
                self._routes[target] = Route(env["n"], Route.at(found).generation)
            else:
                self._routes.pop(target, None)

            def resend() -> None:  # re-routed from here, as if they had just arrived
                for item in kept:
                    self.redeliver(item)

            relocator = self.rt.relocator
            if relocator is None or not relocator.fence_back(target, resend):
                resend()

    def tell_origin(self, origin: str | None, target: str, route: Route) -> None:
        """After relaying a call of ``origin``: tell it the better route (it relayed first)."""
        if origin is None or origin == self.rt.node_id:
            return
        with contextlib.suppress(Unavailable):  # a hint only: the relay already happened
            self.transport.send(
                origin, {"k": "route", "t": target, "n": route.node, "g": list(route.generation)}
            )

    # -- the origin side -----------------------------------------------------------------------
    def envelope(
        self, call: MessageCall, reply: Completion | None, hops: int = 0
    ) -> dict[str, Any]:
        """``call`` as it crosses the boundary; a request's reply is awaited here from now."""
        msg = call.msg
        envelope: dict[str, Any] = {
            "k": "request" if reply is not None else "send",
            "to": call.kind,
            "t": call.target,
            **to_wire(msg),
            "m": call.meta or {},
            "o": self.rt.node_id,
            "oo": call.origin or self.rt.node_id,  # the first node: route updates go there
            "v": self.rt.node_id,  # the node handing it over (a relocation target asks)
            "h": hops,
            "i": call.instance_type if call.instance else None,
            "ii": call.instance,
        }
        if reply is not None:
            envelope["c"] = self.register_pending(reply, reply_type(type(msg)))
            envelope["d"] = self.rt.deadline_of(call.deadline)  # the time travels with it
        return envelope

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
        elif kind == "route":
            self._on_route(envelope)
        elif kind == "fence":
            self._on_fence(envelope)
        elif kind == "fenced":
            self._on_fenced(envelope)
        elif kind in self._handlers:  # relocation and cross-node Join (plugged in)
            self._handlers[kind](envelope)
        elif kind == "create":
            self._on_create(envelope)
        else:
            self._on_call(envelope)

    def _on_create(self, env: dict[str, Any]) -> None:
        call: CreateCall[Any] = CreateCall(self.rt, TargetKind.SPOT, env["tn"], env["t"], True)
        try:
            done = self.rt.submit_create(call, NO_WAIT)
        except ZLinkError as exc:
            self._reply(env, error=exc)
            return
        done.add_callback(lambda value, error: self._reply(env, value, error))

    def redeliver(self, env: dict[str, Any], force: bool = False) -> None:
        """Handle a kept call or fence here again, as if it had just arrived (``force``: past
        this node's own seal, for calls parked at a move that did not happen)."""
        if env["k"] == "fence":
            self._on_fence(env)
        else:
            self._on_call(env, force)

    def _on_call(self, env: dict[str, Any], force: bool = False) -> None:
        request = env["k"] == "request"
        try:
            msg = from_wire(env)
        except Exception as exc:  # noqa: BLE001 - a bad payload fails that request only
            self.rt.metrics.add("bad_wire_payloads")
            if request:
                self._reply(env, error=InvalidArgument(f"bad payload for {env['tn']}: {exc}"))
            return
        call_cls = RequestCall if request else SendCall
        call: MessageCall = call_cls(self.rt, env["to"], env["t"], msg)
        call.meta = env["m"] or None
        call.origin = env.get("oo", env["o"])
        call.via = env.get("v")
        call.instance, call.instance_type = bool(env.get("ii")), env.get("i")
        if request:
            call.deadline = float(env["d"])
        try:
            done = self.rt.submit(call, Completion() if request else None, NO_WAIT,
                                  hops=env["h"] + 1, force=force)  # fmt: skip
        except ZLinkError as exc:
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


class Route(NamedTuple):
    """Where a node sends a remote target: a node, at an (object, authority) generation."""

    node: str
    generation: tuple[int, int]

    @staticmethod
    def at(location: Location) -> Route:
        """The route to where the Location Store says the target is."""
        return Route(location.owner, (location.object_generation, location.authority_generation))


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def _adapter(tp: Any) -> TypeAdapter[Any]:
    adapter = _ADAPTERS.get(tp)
    if adapter is None:
        adapter = _ADAPTERS[tp] = TypeAdapter(tp)
    return adapter


__all__ = ["MAX_POINTERS", "_MAX_HOPS", "MeshRouter", "Route", "decode_error", "encode_error"]
