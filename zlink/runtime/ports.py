"""What the runtime needs from the parts above it: Protocols, filled in by ``zlink.node``.

``zlink.relocation`` sits above ``zlink.runtime`` (it moves the runtime's objects), yet a call
that meets a move must be diverted to it, and a Join across nodes must ask it. The runtime holds
these ports; the node plugs the relocation parts in (architecture: a lower part calls a higher
one only through a Protocol or a callback passed down, never by importing it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..errors import ZLinkError
    from ..executor import OwnerLanes
    from ..messaging.calls import BatchSendCall, MessageCall
    from ..messaging.completion import Admitted, Completion
    from ..messaging.message import Message
    from .acts import ActorAct, SpotAct
    from .routing import Relayable


class RelocationPort(Protocol):
    """The relocator as the runtime and its router see it."""

    def divert(
        self, call: MessageCall, reply: Completion | None, hops: int,
        lanes: OwnerLanes | None = None, room: Admitted | None = None,
    ) -> bool:  # fmt: skip
        """Keep a call for an object that is moving; ``False`` if it is not moving. Calls
        waiting for room in its ``lanes`` are routed again first, in their order. Past what
        the object's lane holds, a call waits (``room``, or a request's deadline) or a plain
        send is ``ResourceExhausted`` (python-api §9)."""
        ...

    def divert_batch(self, call: BatchSendCall, room: Admitted | None) -> bool:
        """A batch for an object sealed here for a move, parked, waiting or refused whole;
        ``False`` if it is not moving."""
        ...

    def divert_envelope(self, target: str, env: Relayable) -> bool:
        """Park or relay a call or fence for a target sealed here; ``False`` if none is."""
        ...

    def moving(self, spot_id: str) -> bool:
        """Whether a move of ``spot_id`` arrives here or leaves from here now (a stop closes
        neither: the move's commit decides where it lives)."""
        ...

    def arriving(self, target: str) -> bool:
        """Whether ``target`` is arriving on this node by a move, not yet open."""
        ...

    def uncommitted(self, target: str) -> bool:
        """Whether ``target`` arrives here and its move is not committed (its queue holds
        copies of what the source keeps until the store answers)."""
        ...

    def fence_back(self, target: str, resend: Callable[[bool], None]) -> bool:
        """This node's fence for an arriving target is back; ``False`` if none is arriving.
        ``resend(mine)`` routes again what the router kept behind the fence: the calls (and
        fences) first sent from this node (``mine``), or those of its peers."""
        ...

    def after_move(self, target: str, then: Callable[[], None]) -> None:
        """``then()`` runs (infrastructure thread) once the move of ``target`` from or to
        this node ended; at once if none is under way."""
        ...

    def members_follow(self, spot_id: str) -> bool:
        """Whether a move of the PER_ACTOR Spot ``spot_id`` (its shell's, then its members')
        is under way from this node."""
        ...

    def signaled(self, act: SpotAct) -> bool:
        """The Spot reached a ``relocation_ready()`` boundary; ``False`` if no move waits."""
        ...

    def self_close(self, act: SpotAct, close: Callable[[], bool]) -> bool:
        """An Instance Spot closes itself (any thread, no lock held): sealed for a move
        leaving this node that has not shipped, the move's barrier withdraws it and the Spot
        closes then (``False``); else ``close()`` (it takes the directory lock), with the
        relocator's lock held so that no seal comes between, and what it returns."""
        ...

    def not_sent(self, rid: int, error: ZLinkError) -> None:
        """What move ``rid`` sent its target could not be sent: withdrawn now."""
        ...

    def fenced(self) -> None:
        """This node fenced itself: every move it is part of ends here."""
        ...

    def peer_declared_down(self, peer: str) -> None:
        """(Infrastructure thread, no lock held.) The store declared ``peer`` down: end every
        move and cross-node Join that waits on it (python-api §10 "Failure", §11)."""
        ...


class RemoteJoinPort(Protocol):
    """Cross-node Join, as membership sees it."""

    def ask(self, actor: ActorAct, target_id: str, request: Message | None) -> None:
        """Ask the node that holds ``target_id`` to take ``actor`` in."""
        ...


class LeaseHolder(Protocol):
    """This node's registration in the store (``zlink.mesh.membership``)."""

    @property
    def lease_until(self) -> float | None:
        """When the last confirmed lease ends; ``None`` before registration."""
        ...

    @property
    def incarnation(self) -> int:
        """This node's incarnation in the store (``0`` before registration)."""
        ...

    def holds(self) -> bool:
        """Whether this node may serve; fences it now if its lease ran out unnoticed."""
        ...

    def suspect(self, peer: str) -> None:
        """The connection to ``peer`` dropped: ask the store whether it is down."""
        ...
