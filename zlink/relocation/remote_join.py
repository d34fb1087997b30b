"""A Join into a User Spot on another node (execution-model §5; kotlin-spot-interface: "a
cross-node Join and relocation create [the Actor handler] again in the target activation").

The order follows a same-node Join, with the move in the middle:

1. The Actor is held at its next turn boundary (the deferred Join's barrier, as on one node).
2. The source asks the target Spot's node; ``on_actor_join`` runs there as a lifecycle turn of
   that Spot. A rejection, an error or no answer in time completes the Join as failed.
3. Accepted: the held Actor is sealed, captured with its adapter and moved with its queue and
   timers (``zlink.relocation.relocator``, a unit of one) into that Spot. An Actor type registered
   ``Relocation.disabled()`` cannot join across nodes (a relocation policy failure). No
   caller waits on this move, so it has a deadline of its own, the request timeout: one not
   at its commit by then is withdrawn (python-api §8) and the Join fails.
4. On the target, once authority is committed: ``on_joined_actor`` on the Spot, then
   ``on_join_completed`` on the new Actor instance; the source Spot (if a User Spot) gets
   ``on_leave_actor``. A failed move leaves the Actor where it was and completes the Join as
   failed; the target Spot has then accepted an Actor that never came (it must tolerate it).

A node that dies mid-Join (declared down by the store, python-api §10 "Failure"): the Spot's
node dying before it answers fails the question at once (the router fails what awaits a dead
peer), and before the commit aborts the move (``Outbound.target_down``): either way the Join
completes as failed and the Actor stays where it was, its Entry Spot or the Spot it was in. The
Actor's node dying before the commit leaves the Spot's node with an arriving Actor that never
comes: it is forgotten there (``Inbound.source_down``), no member stays pending. A move already
committed stays done: the Actor belongs to the Spot's node (if that one dies before opening it,
the Actor is lost with it: Actors are not re-homed) and its old Spot here is told it left.

Lock order (``zlink.lock_order``): only the route lock is taken here, to read a route; the
move itself takes the relocator's locks in their order (``source.py``).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from ..errors import (
    DeadlineExceeded,
    InvalidArgument,
    InvalidOperation,
    NotFound,
    ResourceExhausted,
    Unavailable,
    ZLinkError,
)
from ..executor import Admission, Lane, Turn
from ..mesh import wire
from ..messaging.completion import Completion
from ..runtime.routing import MAX_HOPS, Route
from ..types import ActorJoinCompletion, ActorJoinResult, RelocationPolicy, SpotKind
from .state import decode_reply, encode_reply

if TYPE_CHECKING:
    from ..messaging.message import Message
    from ..runtime.acts import ActorAct, SpotAct
    from ..runtime.routing import MeshRouter
    from ..runtime.runtime import Runtime
    from .relocator import Relocator


class RemoteJoin:
    """One node's side of cross-node Joins, as the Actor's node and as the Spot's."""

    def __init__(self, rt: Runtime, router: MeshRouter, relocator: Relocator) -> None:
        self.rt = rt
        self.router = router
        self.relocator = relocator

    # -- the Actor's node ------------------------------------------------------------------------
    def ask(self, actor: ActorAct, target_id: str, request: Message | None) -> None:
        """The Actor is held: ask the node of ``target_id`` whether it may join. A Spot that
        is nowhere is ``NotFound`` whatever the Actor's policy; an Actor registered
        ``Relocation.disabled()`` fails only once there is a node it would have to move to."""
        answer = Completion()
        self.rt.arm(answer, None, f"{target_id!r} did not answer the Join in time")
        answer.add_callback(lambda value, error: self._answered(actor, target_id, value, error))
        payload = None if request is None else encode_reply(request)

        def located(route: Route | None, error: BaseException | None) -> None:
            if route is None:
                answer.set(None, _nowhere(target_id, error))
                return
            if actor.spec.relocation.kind is RelocationPolicy.DISABLED:
                answer.set(None, InvalidOperation(
                    f"{actor.spec.name!r} is registered with Relocation.disabled(): it cannot "
                    f"join {target_id!r} on another node"
                ))  # fmt: skip
                return
            envelope = wire.JoinAskEnvelope(
                target_id, actor.actor_id, self.rt.node_id,
                self.router.register_pending(answer, None, route.node), 0, payload,
            )  # fmt: skip
            try:
                self.router.post(route.node, envelope)
            except Unavailable as exc:
                answer.set(None, exc)

        self.router.locate(target_id, located)

    def _answered(
        self, actor: ActorAct, target_id: str, value: Any, error: BaseException | None
    ) -> None:
        from ..runtime.acts import GONE

        if error is not None or actor.state is GONE:  # (dropped at a fence meanwhile: its
            # completion is skipped, ``complete_join``; it never moves)
            self._fail(actor, target_id, error or Unavailable(f"{actor.actor_id!r} is gone"))
            return
        try:
            answer = wire.load_record(wire.JoinAnswer, value)
        except wire.WireError as exc:
            self._fail(actor, target_id, exc)
            return
        if not answer.accept:
            rejected = InvalidOperation(f"{target_id!r} rejected the join: {answer.reason}")
            self._fail(actor, target_id, rejected, answer)
            return
        source = actor.spot
        moved = Completion()
        moved.add_callback(lambda _v, err: self._moved(actor, source, target_id, err))
        # no caller gives up on it: a move not at its commit within the request timeout is
        # withdrawn (python-api §8), so a Join never waits for good (cancelled once done)
        timeout = self.rt.request_timeout
        moved.timer = self.rt.infra.call_later(
            timeout, self.relocator.withdraw, actor.actor_id, moved, DeadlineExceeded(
                f"the move of {actor.actor_id!r} into {target_id!r} did not reach its commit "
                f"within {timeout:g} s; it was withdrawn"
            ),
        )  # fmt: skip
        try:
            grant = wire.JoinGrant(answer.reply)
            self.relocator.seal(source, answer.node, moved, False, unit=actor,
                                join=(target_id, grant))  # fmt: skip
        except ZLinkError as exc:
            moved.set(None, exc)

    def _moved(
        self, actor: ActorAct, source: SpotAct, target_id: str, error: BaseException | None
    ) -> None:
        from ..runtime.acts import GONE
        from ..runtime.jobs import LifeJob

        if self.rt.fenced:  # its node dropped it, and its Spot: no lifecycle step runs
            return  # (``Closing.drop_all``; an audit found the Spot told it left)
        if error is not None and actor.state != GONE:  # it stays here, reopened: it failed
            self._fail(actor, target_id, error)
            return
        # it left: moved, or committed to a node that then went down before it opened it
        # (the Actor belongs to that node, lost with it: nothing more runs on this copy)
        if source.state is GONE:  # closed meanwhile (a close waits for a moving member:
            source.members.pop(actor.actor_id, None)  # this is a stop's close, or a fence)
            self.rt.metrics.add("lifecycle_skipped_on_leave_actor")
        elif source is actor.entry or source.members.pop(actor.actor_id, None) is not None:
            old = actor.instance  # (its Entry Spot hears it leave too: python-api §3)
            source.owner.put_unreserved(
                LifeJob(source, "on_leave_actor", lambda: source.instance.on_leave_actor(old),
                        lane=Lane.UNRESERVED)
            )  # fmt: skip

    def _fail(
        self,
        actor: ActorAct,
        target_id: str,
        error: BaseException,
        answer: wire.JoinAnswer | None = None,
    ) -> None:
        typed = error if isinstance(error, ZLinkError) else Unavailable(str(error))
        reply = None
        if answer is not None and answer.reply is not None:
            reply = decode_reply(answer.reply)
        self.rt.complete_join(actor, ActorJoinCompletion(False, target_id, reply, typed), None)

    # -- the Spot's node -------------------------------------------------------------------------
    def on_ask(self, env: wire.JoinAskEnvelope) -> None:
        """On the infrastructure thread: run ``on_actor_join`` as a lifecycle turn of the Spot."""
        from ..runtime.acts import GONE, READY, SEALED
        from ..runtime.jobs import LifeJob, failure

        def answer(value: Any = None, error: BaseException | None = None) -> None:
            self.router.reply(env.origin_node, env.correlation, value, error)

        target = self.rt.spots.get(env.target)
        if target is None or target.state == GONE:
            if env.hops >= MAX_HOPS:
                answer(error=NotFound(f"no spot {env.target!r} to join"))
                return

            def relay(route: Route | None, error: BaseException | None) -> None:
                if route is None:
                    answer(error=_nowhere(env.target, error))
                    return
                try:  # a stale route: relay the question; the answer goes straight back
                    self.router.post(route.node, replace(env, hops=env.hops + 1))
                except Unavailable as exc:
                    answer(error=exc)

            self.router.locate(env.target, relay)
            return
        if target.kind is not SpotKind.USER:
            answer(error=InvalidOperation(f"{env.target!r} is not a User Spot; only those "
                                          "hold Actors"))  # fmt: skip
            return
        relocator = self.rt.relocator
        if target.state == SEALED and relocator is not None:  # moving: asked again once the
            relocator.after_move(env.target, partial(self.on_ask, env))  # move ended, where
            self.rt.metrics.add("joins_waiting_for_move")  # the room is then
            return
        if target.state != READY:
            answer(error=Unavailable(f"{env.target!r} is sealed or closing"))
            return
        try:
            request = None if env.request is None else decode_reply(env.request)
        except Exception as exc:  # noqa: BLE001 - a bad request fails this Join only
            answer(error=InvalidArgument(f"bad join request: {exc}"))
            return

        def decided(turn: Turn) -> None:
            result = turn.result if turn.result is not None else ActorJoinResult()
            if turn.error is not None:  # (one discarded unrun keeps its own error: an
                answer(error=failure(turn))  # audit found it a HandlerError, as on one node)
            elif not isinstance(result, ActorJoinResult):
                answer(error=InvalidArgument(f"on_actor_join gave {result!r}: not a JoinResult"))
            else:
                try:
                    reply = None if result.reply is None else encode_reply(result.reply)
                except TypeError as exc:
                    answer(error=InvalidArgument(f"join reply: {exc}"))
                    return
                granted = wire.JoinAnswer(result.accept, reply, result.reason, self.rt.node_id)
                answer(wire.dump_record(granted))

        job = LifeJob(
            target, "on_actor_join",
            lambda: target.instance.on_actor_join(env.actor_id, request), decided,
        )  # fmt: skip
        verdict = target.owner.put_life(job)
        if verdict != Admission.ADMITTED:  # as on one node (``Membership._join_ask``)
            refused: ZLinkError = (
                Unavailable(f"{env.target!r} is sealed or closing")
                if verdict == Admission.CLOSED
                else ResourceExhausted(f"the lifecycle lane of {env.target!r} is full")
            )
            answer(error=refused)


def _nowhere(target: str, error: BaseException | None) -> ZLinkError:
    """Why a Join found no node to ask: the store does not know ``target``, or failed."""
    if error is not None:
        return Unavailable(f"the location store could not say where {target!r} is: {error}")
    return NotFound(f"no spot {target!r} to join")
