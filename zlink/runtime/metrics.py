"""Node counters: late replies, handler errors, rejected admissions (python-api §5).

Every fault and every discard is counted once, under a name that says what it was:

* ``handler_errors``: a message or timer handler raised;
* ``lifecycle_errors_<callback>``: a lifecycle callback raised or returned what it must not
  (``constructor``, ``on_create``, ``on_initialize``, ``on_create_actor``, ``on_actor_join``,
  ``on_joined_actor``, ``on_closing``, ...); ``closing_overdue``: an ``on_closing`` cancelled
  at its deadline;
* ``lifecycle_skipped_<step>``: a lifecycle step discarded unrun (``on_closing``,
  ``activation``, ``on_create_actor``, ...: the node stopped first);
* ``messages_discarded_<reason>``: messages that never reached their handler
  (``at_shutdown``, ``spot_closed``, ``not_created``, ``actor_disconnected``), each message
  of a batch counted; ``actors_disconnected``: Actors ended by ``disconnect``;
* ``worker_calls_abandoned_at_shutdown`` / ``worker_calls_discarded_at_shutdown``: a
  ``context.workers`` call still running when shutdown's timeout ran out (left on its daemon
  thread, its waiter failed with ``Unavailable``) / still queued (never run);
  ``turns_abandoned_at_shutdown``: a turn (a handler) still running then, left on its worker
  thread (its caller failed with ``Unavailable``);
* ``calls_failed_at_shutdown``: a call still awaiting its outcome when the node stopped,
  failed with ``Unavailable`` then (a handler that awaited one and lets that error through
  is not counted again as a handler error);
* ``calls_timed_out``: a request, a create or a Join's question whose deadline failed it
  (``DeadlineExceeded``), once, on the node it was made on, wherever it was then (queued,
  waiting for room, on another node); ``late_replies`` counts those whose handler still
  ran; ``worker_calls_timed_out``: a ``context.workers`` call past its own timeout (its
  outcome, when it comes, ``worker_results_late``);
* ``instance_reactivations`` / ``messages_carried_to_next_activation``: an Instance Spot
  that closed with calls still to run was made again at once, with them (not losses);
  ``instance_reactivations_refused``: the store gave it no new generation (what it held
  failed, counted as ``messages_discarded_spot_closed``);
* ``joins_waiting_for_move``: a Join whose room was sealed for a move, asked again where the
  room went; ``joins_refused_room_moving``: a Join to a room on another node that a member of
  a PER_ACTOR Spot began while that Spot moved (it follows its Spot first: ``Unavailable``);
* ``relocation_restore_errors``: a restore attempt of an arriving Spot failed;
  ``relocation_commits_asked_again``: the store failed a move's commit and could not say
  whether it made it (or refused a member's write after the Spot's was made): asked again;
* ``relayed_calls``: calls this node relayed on by a stale route; ``relayed_replies_rebound``:
  requests of this node's callers that a node took after a relay, telling this node their
  reply comes from there now (the request kept its reply route: kotlin-spot-interface);
* ``replies_undeliverable``: a reply for a caller on a node this node cannot reach (gone);
  ``envelopes_undeliverable``: another envelope of this node's that could not be sent;
* ``call_intake_errors``: a call from another node this node failed to take for a fault of
  its own (its caller gets ``Unavailable`` at once; a one-way one is also counted as
  ``sends_dropped_intake_error``);
* ``handlers_cancelled_at_stop``: a handler suspended when the node stopped, cancelled by
  its Spot's close deadline (python-api §11), logged at WARNING (not a handler error);
* ``publish_dropped`` / ``publish_unhandled`` / ``publish_missed_<state>``: a Logical
  Multicast event a subscriber did not get: its lane was full, it has no handler for the
  type, or it was past READY (``closing``, ``gone``; ``sealed`` off a mesh only: in a mesh a
  subscriber sealed for a move is counted by ``publish_missed_moving``);
  ``publish_missed_moving``: events a subscriber missed while sealed for a move or on its
  way (neither its old node's copy nor its new node's reached it), counted as it opens
  (``zlink.runtime.events``); ``publish_duplicates_dropped`` (not a loss): a second copy of
  an event a subscriber had, met after a move; and
  ``publish_dropped_outbox_full`` / ``_unreachable`` / ``_too_large`` / ``_shutdown`` /
  ``_does_not_cross``: an event made here that another node did not get (its outbox was past
  ``peer_outbound_submit_bytes``, it went away, it takes smaller frames, this node stopped
  with the event still in its outbox, or it could not be encoded);
* the mesh's sessions (``zlink.mesh.zmq_transport``): ``sends_dropped_peer_gone`` /
  ``data_unacknowledged_peer_gone`` (one-way messages a session kept for a peer when it
  ended, never sent / sent and never acknowledged, so maybe handled: the peer restarted,
  left, or stayed away 30 s; each message of a batch), ``frames_dropped_peer_down`` (the
  rest of what it kept:
  requests, whose callers fail when the peer is declared down, and the mesh's own frames),
  ``sends_dropped_shutdown`` (still in the outbox when a stopping node gave up waiting, or
  kept behind a route fence that had not come back),
  ``data_unacknowledged_at_stop`` (sent, never acknowledged: may have arrived),
  ``data_lost_in_transit`` / ``completion_lost_in_transit`` (numbers that never came); and,
  not losses, ``data_resent`` / ``completion_resent``, ``data_duplicates`` /
  ``completion_duplicates``, ``sessions_started_over``, ``hellos_unlisted``;
  ``handshakes_refused`` (a peer or client this node serves failed its CURVE handshake) and
  ``handshakes_failed`` (this node's own handshake with a peer failed: keys on one side only);
* flow control between nodes (python-api §9), not losses: ``peers_paused`` (this node
  stopped taking a peer's DATA), ``pauses_lifted_for_infrastructure`` (it took that DATA up to a
  route fence or a move's envelope it waits for, behind it), ``ahead_notices_expired`` (the
  notice of one, or the one, whose other half never came within a request timeout: dropped).
"""

from __future__ import annotations

import threading


class Metrics:
    """Counters bumped off the hot path; ``_lock`` keeps increments exact on every build."""

    __slots__ = ("_counts", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def add(self, name: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``name``."""
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + n

    def get(self, name: str) -> int:
        """The counter ``name`` (0 if never bumped)."""
        return self._counts.get(name, 0)

    def snapshot(self) -> dict[str, int]:
        """A copy of every counter."""
        with self._lock:
            return dict(self._counts)
