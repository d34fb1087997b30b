"""Activation and create of Spots and Actors (§14; python-api §6).

Guarantees / assumes:
* Only the owner the Location Store confirms runs a factory; the store is asked with no lock
  held, and the directory is written under its lock after (asking again if the object went
  away meanwhile).
* Lock order (``zlink.lock_order``): only the directory lock is taken here, never with
  another held by this module.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from ..errors import (
    HandlerError,
    InvalidArgument,
    InvalidOperation,
    NotFound,
    ResourceExhausted,
    Unavailable,
    ZLinkError,
)
from ..executor import Admission, Lane, RoomWaiter, Turn, current_turn
from ..mesh.location import Location, Reservation, take_left_row
from ..types import TargetKind

if TYPE_CHECKING:
    from .runtime import Runtime
from ..messaging.calls import (
    KEEP_TURN,
    CreateCall,
    MessageCall,
    WaitMode,
)
from ..messaging.completion import Completion, expire
from ..types import (
    ActorCreateResponse,
    ActorCreateResult,
    SpotCreateResponse,
    SpotCreateResult,
    SpotKind,
)
from .acts import GONE, READY, ActorAct, SpotAct
from .jobs import (
    BatchJob,
    LifeJob,
    SendJob,
    discard_jobs,
    failure,
    lifecycle_error,
    not_serving,
    run_steps,
)

if TYPE_CHECKING:
    from ..app import TypeSpec
    from ..messaging.message import Message


_log = logging.getLogger("zlink.runtime")


class Creation:
    """Activation and create / get-or-create of one node (§14): the creation part of
    :class:`Runtime`. Collaborators: the runtime (its directory, the store through its router,
    the infrastructure heap for deadlines)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._timed_out = partial(rt.metrics.add, "calls_timed_out")

    # -- activation ----------------------------------------------------------------------------
    def register_spot(
        self, spec: TypeSpec, spot_id: str, generation: int | None = None, authority: int = 1,
        *, request: Message | None = None, rehomed: bool = False,
        then: Callable[[Any, BaseException | None], Any] | None = None, wake: bool = True,
        carried: list[SendJob | BatchJob] | None = None, publish: bool = True,
    ) -> SpotAct:  # fmt: skip
        """Make a Spot and publish it in the node's table, its activation (``activate``)
        queued first: a call that finds it there queues behind the constructor, ``on_create``
        and ``on_initialize`` (lifecycle first), never ahead of them (concepts "Lifecycle",
        §14). (Published first, a probe's message ran on a worker with no instance yet.) The
        owner is woken only once it is published, so the activation never runs before
        anyone can find the Spot (``wake=False``: the caller wakes it, once it has
        published more). ``then``: called with the activation's outcome. The caller holds
        the directory lock, but at the node's start. ``carried``: messages the activation
        before this one took and never ran (``Closing._reactivate``), queued behind the
        activation, in their order, before anyone can find the Spot. ``publish=False``: the
        caller publishes it (``Directory.forget`` of the one it replaces) and wakes it."""
        act = SpotAct(self.rt, spec, spot_id, generation or self.rt.directory.next_generation())
        act.authority = authority  # the store's: a re-homed Spot's is past 1 (fencing)
        if then is not None:
            assert act.activated is not None  # just made
            act.activated.add_callback(then)
        self.activate(act, request, rehomed)
        for job in carried or ():
            job.act = act
            act.owner.lanes.put_app_moved(job, job.size, job.count, ready=False)
        if not publish:
            return act
        self.rt.spots[spot_id] = act
        if wake:
            act.owner.wake()
        return act

    def instance_spec(self, call: MessageCall) -> TypeSpec:
        name = call.instance_type or self.rt.directory.only_instance_type
        if name is None:
            raise InvalidArgument(
                "instance_spot() needs a stable type when the app has more than one"
            )
        spec = self.rt.app.spots.get(name)
        if spec is None or spec.kind is not SpotKind.INSTANCE:
            raise InvalidArgument(f"{name!r} is not a registered Instance Spot type")
        return spec

    def activate_instance(
        self, spec: TypeSpec, spot_id: str, generation: int | None = None, authority: int = 1
    ) -> SpotAct:
        with self.rt.directory.lock:
            act = self.rt.spots.get(spot_id)
            if act is not None:
                return act
            return self.register_spot(spec, spot_id, generation, authority)

    def rehome(self, location: Location, lapsed: str | None = None) -> bool:
        """Activate here a Spot the store just gave this node because its owner's lease had
        lapsed (python-api §10 "Failure"): a new ``ObjectGeneration``; the constructor and
        ``on_initialize`` run, ``on_create`` does not (it was created before; its state is
        gone). ``lapsed``: the node that owned it (logged). ``False`` for what cannot be
        re-homed here: an Actor (it lived in its Entry Spot's node), or a type this app does
        not have."""
        spec = self.rt.app.spots.get(location.type_name)
        if location.kind != str(TargetKind.SPOT) or spec is None:
            return False
        if spec.kind is SpotKind.ENTRY:
            return False
        with self.rt.directory.lock:
            if location.spot_id in self.rt.spots:
                return True
            self.register_spot(spec, location.spot_id, location.object_generation,
                               location.authority_generation, rehomed=True)  # fmt: skip
        self.rt.metrics.add("spots_rehomed")
        _log.info("node %s re-homed spot %r (generation %d, its owner %s lost its lease)",
                  self.rt.node_id, location.spot_id, location.object_generation,
                  "(unknown)" if lapsed is None else repr(lapsed))  # fmt: skip
        return True

    def activate(self, act: SpotAct, request: Message | None, rehomed: bool = False) -> None:
        """Queue construction, ``on_create`` (User Spots, not when re-homed) and
        ``on_initialize`` (lifecycle), the owner not woken (``register_spot`` wakes it once
        the Spot is published)."""

        def construct() -> None:
            act.instance = act.spec.cls(act.context)

        steps: list[tuple[str, Callable[[], Any]]] = [("constructor", construct)]
        if act.kind is SpotKind.USER and not rehomed:
            steps.append(("on_create", lambda: act.instance.on_create(request)))
        steps.append(("on_initialize", lambda: act.instance.on_initialize()))

        def done(turn: Turn) -> None:
            if turn.error is not None:  # (counted and logged by the job, by the step that failed)
                self.deactivate(act, failure(turn))
                return
            act.state = READY
            reply = turn.result.reply if isinstance(turn.result, SpotCreateResponse) else None
            result = SpotCreateResult(act.spot_id, act.ref, True, reply)
            activated, act.activated = act.activated, None  # idle Spots keep no completion
            assert activated is not None
            activated.set(result, None)

        job = LifeJob(act, "activation", lambda: run_steps(job, *steps), done, Lane.UNRESERVED)
        act.owner.lanes.put_unreserved(job, True)

    def deactivate(self, act: SpotAct, error: Exception) -> None:
        """An activation failed (or never ran): the Spot goes, its creator gets ``error``, and
        what was queued for it is discarded (``messages_discarded_not_created``)."""
        with self.rt.directory.lock:
            self.rt.directory.forget(act)
            act.state = GONE  # (under the lock, once forgotten: see ``Runtime._not_ready``)
        act.cancel_timers()  # (one its activation registered before it failed never ticks)
        act.owner.lanes.end_waits()
        if act.activated is not None:
            act.activated.set(None, error)
        # what was sent to it fails as its create did: a lifecycle callback that raised is a
        # HandlerError (errors.md), which an Instance Spot's first message is the create of
        failed = NotFound(f"spot {act.spot_id!r} failed to activate")
        self._discard_queued(act, error if isinstance(error, HandlerError) else failed)

    def _discard_queued(self, act: SpotAct | ActorAct, error: ZLinkError) -> None:
        """Discard what waits for ``act``, which was never made (or the node stops)."""
        if self.rt.stopping:
            error = Unavailable(f"node {self.rt.node_id} shut down before it ran")
        reason = "at_shutdown" if self.rt.stopping else "not_created"
        discard_jobs(self.rt, act.owner.drain(), error, reason)

    # -- create ----------------------------------------------------------------------------------
    def _claim(
        self, table: Mapping[str, Any], object_id: str, kind: TargetKind, type_name: str,
        completion: Completion, then: Callable[[Reservation | None], bool], get: bool,
    ) -> None:  # fmt: skip
        """Call ``then(reservation)``: at once with ``None`` when ``object_id`` lives here or
        there is no store; else once the store has reserved it (or said who owns it), on the
        infrastructure thread, the store asked on its own thread with no lock held (python-api
        §10). ``then`` holds the directory lock while it decides, and returns ``False`` when
        the object it was told lives here went away meanwhile: the store is asked after all.
        What ``then`` raises later, or a store failure, completes ``completion``."""
        router = self.rt.router
        if router is None or object_id in table:
            if not then(None):
                self._claim(table, object_id, kind, type_name, completion, then, get)
            return
        asked = router.store_worker.call(
            router.store.reserve,
            object_id,
            str(kind),
            type_name,
            self.rt.node_id,
            self.rt.incarnation,
        )
        asked.add_callback(partial(self._reserved, table, object_id, kind, type_name,
                                   completion, then, get, False))  # fmt: skip

    def _reserved(
        self, table: Mapping[str, Any], object_id: str, kind: TargetKind, type_name: str,
        completion: Completion, then: Callable[[Reservation | None], bool], get: bool,
        taken: bool, held: Reservation | None, error: BaseException | None,
    ) -> None:  # fmt: skip
        """(``_claim``: the store's answer, on the infrastructure thread.) ``taken``: the
        answer of :meth:`_left_row`, which is not taken again."""
        try:
            if error is not None:
                raise Unavailable(f"the location store could not reserve {object_id!r}: {error}")
            assert held is not None
            loc = held.location
            if loc.kind != kind:  # the store holds the id for the other kind
                raise _other_kind(object_id, TargetKind(loc.kind), loc.type_name, get,
                                  loc.owner_node)  # fmt: skip
            if loc.owner_node == self.rt.node_id and (
                self.rt.fenced or loc.owner_incarnation != self.rt.incarnation
            ):  # granted to an incarnation that fenced itself meanwhile: never activated
                raise Unavailable(
                    f"node {self.rt.node_id} fenced itself while the store gave it"
                    f" {object_id!r}; try again"
                )
            if not held.created and loc.owner_node == self.rt.node_id and not taken:
                with self.rt.directory.lock:
                    left = object_id not in table
                if left:  # a row of this incarnation, nothing here
                    self._left_row(table, object_id, kind, type_name, completion, then, get,
                                   loc)  # fmt: skip
                    return
            then(held)  # (a reservation is never a "went away")
        except ZLinkError as exc:  # refused: as it would have been at the call site
            if completion.timer is not None:
                completion.timer.cancel()
            completion.set(None, exc)

    def _left_row(
        self, table: Mapping[str, Any], object_id: str, kind: TargetKind, type_name: str,
        completion: Completion, then: Callable[[Reservation | None], bool], get: bool,
        loc: Location,
    ) -> None:  # fmt: skip
        """(``_reserved``.) The store's row for ``object_id`` is this incarnation's, but
        nothing here has it: a close whose ``release`` the store failed (an audit found the
        next activation then took the closed one's object generation, so an old ref
        addressed the new one, execution-model §14), or one on its way. While its release,
        or another claim's taking it, is under way here (``Runtime.releasing``), the claim
        waits and asks again once that ended (a review found a late release delete the row
        of a new activation, and two claims each take the row, the second deleting the
        first's). Else it is released here (fenced) and claimed anew, with a new object
        generation (``take_left_row``)."""
        router = self.rt.router
        assert router is not None
        if not self.rt.hold_row(object_id, partial(self._claim, table, object_id, kind,
                                                   type_name, completion, then, get)):  # fmt: skip
            return
        take = partial(
            take_left_row,
            router.store,
            object_id,
            str(kind),
            type_name,
            self.rt.node_id,
            self.rt.incarnation,
            loc.authority_generation,
        )

        def taken(found: Reservation | None, error: BaseException | None) -> None:
            try:
                if error is None:
                    self.rt.metrics.add("store_rows_taken_again")
                self._reserved(table, object_id, kind, type_name, completion, then, get, True,
                               found, error)  # fmt: skip
            finally:  # (after the activation is in the table: those waiting find it)
                self.rt.released(object_id)

        router.store_worker.call(take).add_callback(taken)

    def submit_create(self, call: CreateCall[Any], mode: WaitMode) -> Completion:
        if self.rt.fenced or self.rt.stopping or self.rt.draining:
            raise not_serving(self.rt)
        if call.mesh is not None and call.mesh != self.rt.mesh:
            raise NotFound(f"mesh {call.mesh!r} is not reachable from node {self.rt.node_id}")
        if call.kind == TargetKind.ACTOR:
            return self._create_actor(call, mode)
        spec = self.rt.app.spots.get(call.type_name)
        if spec is None or spec.kind is not SpotKind.USER:
            raise InvalidArgument(f"{call.type_name!r} is not a registered User Spot type")
        completion = self._timed(call)
        spot_id = call.object_id or uuid.uuid4().hex
        self._claim(
            self.rt.spots, spot_id, TargetKind.SPOT, spec.name, completion,
            lambda held: self._create_spot(call, spec, spot_id, completion, held), call.get,
        )  # fmt: skip
        return completion

    def _create_spot(
        self, call: CreateCall[Any], spec: TypeSpec, spot_id: str, completion: Completion,
        held: Reservation | None,
    ) -> bool:  # fmt: skip
        """(``_claim``'s ``then``.) ``False``: it went away since it was found here."""
        remote: Location | None = None
        with self.rt.directory.lock:
            self._one_id_space(spot_id, TargetKind.SPOT, call.get, completion)
            existing = self.rt.spots.get(spot_id)
            if existing is None and held is None and self.rt.router is not None:
                return False
            if existing is None:
                generation, authority = None, 1
                if held is not None:
                    if held.location.owner_node != self.rt.node_id:
                        remote = held.location
                    generation = held.location.object_generation
                    authority = held.location.authority_generation
                if remote is None:
                    self.register_spot(spec, spot_id, generation, authority,
                                       request=call.request_msg, then=completion.set)  # fmt: skip
                    return True
        if remote is not None:
            assert self.rt.router is not None
            if not call.get or remote.type_name != spec.name:
                assert completion.timer is not None
                completion.timer.cancel()
                what = "exists already" if not call.get else f"exists as {remote.type_name!r}"
                raise (InvalidOperation if not call.get else InvalidArgument)(
                    f"{spot_id!r} {what} on node {remote.owner_node}"
                )
            self.rt.router.forward_create(call, completion, remote)
            return True
        assert existing is not None
        self._existing(existing, spec, call, completion)
        return True

    def _one_id_space(
        self, object_id: str, kind: TargetKind, get: bool, completion: Completion
    ) -> None:
        """(Directory lock held, as a create decides.) Refuse ``object_id`` when an object of
        the other kind lives under it here: Spots and Actors share one id space, the Location
        Store's, on one node as on several (the store refuses it for other nodes)."""
        found = self.rt.directory.kind_of(object_id)
        if found is not None and found[0] != kind:
            if completion.timer is not None:
                completion.timer.cancel()
            raise _other_kind(object_id, *found, get)

    def _timed(self, call: CreateCall[Any]) -> Completion:
        completion = Completion()
        self.arm(
            completion, call.deadline,
            f"{call.kind} {call.object_id or '(new)'!r} not created within"
            f" {self.deadline_of(call.deadline):g} s",
        )  # fmt: skip
        return completion

    def deadline_of(self, deadline: float | None) -> float:
        """A call's timeout in seconds: its own, or the node's default."""
        return self.rt.request_timeout if deadline is None else deadline

    def arm(
        self, completion: Completion, deadline: float | None, reason: str, counted: bool = True
    ) -> None:
        """Put the call's deadline on the infrastructure heap (it fails it unless it is done;
        counted then: ``calls_timed_out``, but for a call that came from another node, whose
        own node counts it: ``counted=False``)."""
        completion.timer = self.rt.infra.call_later(
            self.deadline_of(deadline), expire, completion, reason,
            self._timed_out if counted else None,
        )  # fmt: skip

    def _existing(
        self,
        act: SpotAct | ActorAct,
        spec: TypeSpec,
        call: CreateCall[Any],
        out: Completion,
    ) -> None:
        if not call.get:
            out.timer.cancel()  # type: ignore[union-attr]
            raise InvalidOperation(f"{call.object_id!r} exists already; use get_or_create")
        if act.spec is not spec:
            out.timer.cancel()  # type: ignore[union-attr]
            raise InvalidArgument(f"{call.object_id!r} exists as {act.spec.name!r}")

        def settle(value: Any, error: BaseException | None) -> None:
            if error is not None:
                out.set(None, error)
            elif isinstance(act, SpotAct):
                out.set(SpotCreateResult(act.spot_id, act.ref, False), None)
            else:
                out.set(ActorCreateResult(act.actor_id, False), None)

        activated = act.activated  # one read: activation may drop it meanwhile
        if activated is None:  # activated already
            settle(None, None)
        else:
            activated.add_callback(settle)  # calls back at once if it completed meanwhile

    def _create_actor(self, call: CreateCall[Any], mode: WaitMode) -> Completion:
        spec = self.rt.app.actors.get(call.type_name)
        if spec is None:
            raise InvalidArgument(f"{call.type_name!r} is not a registered Actor type")
        entry = self.rt.entries[spec.name]
        turn = current_turn()
        if mode == KEEP_TURN and turn is not None and turn.owner is entry.owner:
            raise InvalidOperation("an Entry Spot cannot await an Actor create it must run itself")
        completion = self._timed(call)
        actor_id = call.object_id or uuid.uuid4().hex
        self._claim(
            self.rt.actors, actor_id, TargetKind.ACTOR, spec.name, completion,
            lambda held: self._create_actor_claimed(call, spec, entry, actor_id, completion, held),
            call.get,
        )  # fmt: skip
        return completion

    def _create_actor_claimed(
        self, call: CreateCall[Any], spec: TypeSpec, entry: SpotAct, actor_id: str,
        completion: Completion, held: Reservation | None,
    ) -> bool:  # fmt: skip
        """(``_claim``'s ``then``.) ``False``: it went away since it was found here."""
        with self.rt.directory.lock:
            self._one_id_space(actor_id, TargetKind.ACTOR, call.get, completion)
            existing = self.rt.actors.get(actor_id)
            if existing is None and held is None and self.rt.router is not None:
                return False
            if (
                existing is None
                and held is not None
                and (
                    held.location.owner_node != self.rt.node_id  # it lives on another node
                )
            ):
                assert completion.timer is not None
                completion.timer.cancel()
                if not call.get:
                    raise InvalidOperation(f"{actor_id!r} exists already on another node")
                completion.set(ActorCreateResult(actor_id, False), None)
                return True
            if existing is None:
                act = ActorAct(self.rt, spec, actor_id, entry)
                if held is not None:
                    act.authority = held.location.authority_generation
                self.rt.actors[actor_id] = act
        if existing is not None:
            self._existing(existing, spec, call, completion)
            return True
        request = call.request_msg

        def approve() -> Any:
            job.step = "constructor"
            act.instance = spec.cls(act.context)
            job.step = "on_create_actor"
            return entry.instance.on_create_actor(act.instance, request)

        def not_made(error: BaseException) -> None:
            """The Actor will not be: it leaves, its creators hear ``error`` (``activated``
            tells ``completion`` too), and what was sent to it is discarded and counted."""
            with self.rt.directory.lock:
                self.rt.directory.forget(act)
                act.state = GONE  # (under the lock, once forgotten: ``Runtime._not_ready``)
            act.cancel_timers()  # (one its constructor registered never ticks)
            act.owner.lanes.end_waits()
            if act.activated is not None:
                act.activated.set(None, error)
            self._discard_queued(act, NotFound(f"actor {actor_id!r} was not created"))

        def decided(turn: Turn) -> None:
            res = turn.result if turn.result is not None else ActorCreateResponse()
            if turn.error is not None:  # (counted and logged by the job)
                error: Exception = failure(turn)
            elif not isinstance(res, ActorCreateResponse):
                error = InvalidArgument(f"on_create_actor must return ActorCreateResponse: {res!r}")
                lifecycle_error(entry, "on_create_actor", error)
            elif not res.accept:
                error = InvalidOperation(f"{entry.spot_id!r} refused to create {actor_id!r}")
            else:
                act.state = READY
                activated, act.activated = act.activated, None
                assert activated is not None
                activated.set(ActorCreateResult(actor_id, True, res.reply), None)
                act.owner.unhold()
                return
            not_made(error)

        assert act.activated is not None  # just made
        act.activated.add_callback(completion.set)
        job = LifeJob(entry, "on_create_actor", approve, decided)  # approve() marks its step
        lanes = entry.owner.lanes

        def notify(verdict: Admission) -> None:  # waited for room in the Entry Spot's lane
            if verdict != Admission.ADMITTED:
                not_made(Unavailable(f"{entry.spot_id!r} closed before {actor_id!r} was made"))

        # Many creates at once wait for room in the Entry Spot's lifecycle lane (python-api
        # §9), within the create's own deadline; only past the waiter limit is one refused.
        waiter = RoomWaiter(job, job.size, 1, notify, Lane.LIFECYCLE)
        verdict = lanes.wait_room(waiter)
        if verdict == Admission.WAITING:
            self.rt.metrics.add("admission_waits")

            def timed_out(_value: Any, error: BaseException | None) -> None:
                if error is not None and lanes.cancel_wait(waiter):  # nothing was queued
                    not_made(error)

            completion.add_callback(timed_out)
        elif verdict != Admission.ADMITTED:
            with self.rt.directory.lock:
                self.rt.directory.forget(act)
            completion.timer.cancel()  # type: ignore[union-attr]
            if verdict == Admission.CLOSED:
                raise Unavailable(f"{entry.spot_id!r} is closing")
            self.rt.metrics.add("rejected_admissions")
            raise ResourceExhausted(
                f"the lifecycle lane of {entry.spot_id!r} is full and "
                f"{self.rt.limits.waiters} creates already wait for room"
            )
        return True


def _other_kind(
    object_id: str, kind: TargetKind, type_name: str, get: bool, node: str | None = None
) -> ZLinkError:
    """A create for an id that another kind of object holds: Spots and Actors share one id
    space, the Location Store's, on one node as on several (``get_or_create``: as for another
    type, ``InvalidArgument``; ``create``: ``InvalidOperation``, it exists already)."""
    where = "" if node is None else f" on node {node}"
    if get:
        return InvalidArgument(f"{object_id!r} exists as {kind} {type_name!r}{where}")
    return InvalidOperation(f"{object_id!r} exists already, as {kind} {type_name!r}{where}")
