"""What calls and contexts need from the runtime below them: a Protocol, not an import.

``zlink.runtime`` sits above ``zlink.messaging`` (architecture: the arrows point one way), yet a
call's terminal must hand the call to the runtime of its node. Calls and contexts hold a
``RuntimePort``; ``zlink.runtime.Runtime`` is the one implementation, checked by mypy where the
node builds contexts. Each method says which domain runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..types import SpotRef
    from .calls import (
        BatchSendCall,
        CreateCall,
        JoinCall,
        MessageCall,
        RelocationReadyCall,
        WaitMode,
        WorkerCall,
    )
    from .completion import Admitted, Completion


class RuntimePort(Protocol):
    """The runtime as calls and contexts see it (any thread unless a method says otherwise)."""

    def submit(
        self, call: MessageCall, reply: Completion | None, mode: WaitMode, hops: int = 0,
        force: bool = False, plain: bool = False, room: Admitted | None = None,
    ) -> Completion:  # fmt: skip
        """Route a send or request (``plain``: a send with no option, eligible for the fast
        path); raises before any queue change when it cannot be taken. Given ``room``, a send
        waits for room in a full lane and ``room`` completes once it is accepted (§9)."""
        ...

    def submit_many(
        self, call: BatchSendCall, room: Admitted | None = None, mode: WaitMode = ...
    ) -> None:
        """Admit a batch to one target, all or none (given ``room``: waiting for room)."""
        ...

    def submit_create(self, call: CreateCall[Any], mode: WaitMode) -> Completion:
        """Create or get-or-create a Spot or Actor."""
        ...

    def submit_worker(self, call: WorkerCall[Any]) -> Completion:
        """Run a function on the io or cpu pool, off the gate."""
        ...

    def defer_join(self, call: JoinCall) -> None:
        """Register a Join barrier of the current turn (application domain)."""
        ...

    def defer_relocation_ready(self, call: RelocationReadyCall) -> None:
        """Register a relocation-ready boundary of the current turn (application domain)."""
        ...

    def check_yield(self, call: Any) -> None:
        """Refuse ``yield_()`` where §3 does not offer it (application domain)."""
        ...

    def yield_begin(self) -> object | None:
        """Count a Yield from before its call is submitted; the token goes to ``yield_end``."""
        ...

    def yield_end(self, token: Any) -> None:
        """The Yield's continuation resumed (or its submission failed)."""
        ...

    def subscribe(self, ref: SpotRef, topic: str, on: bool) -> None:
        """Add or remove the Logical Multicast subscription of the incarnation ``ref``."""
        ...

    def leave(
        self, actor_id: str, from_spot: str | None, then: Callable[[], None] | None = None
    ) -> None:
        """Send a member Actor back to its Entry Spot."""
        ...

    def disconnect(self, actor_id: str, from_spot: str | None) -> None:
        """End an Actor after its current turn (``on_disconnect_actor`` on its Spot)."""
        ...

    def close_ref(self, ref: SpotRef) -> bool:
        """Close exactly the incarnation ``ref`` names."""
        ...

    def close_later(self, ref: SpotRef) -> Completion:
        """``close_ref`` without blocking: its outcome (or error) once known."""
        ...

    def close_self(self, spot_id: str) -> None:
        """An Instance Spot closes itself."""
        ...

    def actor_spot_id(self, actor_id: str) -> str:
        """The Spot an Actor belongs to now."""
        ...
