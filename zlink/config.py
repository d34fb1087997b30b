"""``NodeConfig``: a node's identity and limits, defaulting to the seed values (python-api §7)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .addresses import check_advertise, check_listen, is_loopback
from .errors import InvalidArgument
from .executor import LaneLimits

KiB = 1024
MiB = 1024 * 1024


class NodeConfig(BaseModel):
    """Identity and limits of one node. Invalid values raise ``InvalidArgument``.

    Every duration is a finite number of seconds in ``1e-3 .. 1e7`` (python-api §9): a value
    the deadline heap cannot hold is refused here, never found by the infrastructure thread.
    """

    # strict: a number is a number (True or "2" is refused, not taken as 1 or 2); an int is
    # still a valid float; NaN and infinities are named as such, not as out of range
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    node_id: str = Field("node-1", min_length=1, max_length=255)
    mesh: str = Field("main", min_length=1, max_length=255)
    workers: int | None = Field(None, ge=1, le=1024, description="None: one per CPU core")
    app_lane_items: int = Field(1024, ge=1)
    app_lane_bytes: int = Field(64 * MiB, ge=1)
    app_retained_bytes_per_item: int = Field(256, ge=0)
    lifecycle_lane_items: int = Field(128, ge=1)
    lifecycle_lane_bytes: int = Field(4 * MiB, ge=1)
    owner_time_budget: float = Field(0.010, ge=1e-3, le=1e7, description="seconds per owner batch")
    lifecycle_streak_cap: int = Field(8, ge=1, description="lifecycle turns in a row (§7)")
    request_timeout: float = Field(
        30.0, ge=1e-3, le=1e7, description="default request/create deadline (seconds)"
    )
    admission_timeout: float = Field(
        30.0, ge=1e-3, le=1e7, description="how long send.wait()/future() wait for room"
    )
    peer_backlog_items: int = Field(
        256, ge=1, description="calls from one peer waiting for room before it is paused"
    )
    peer_outbound_bytes: int = Field(
        256 * KiB, ge=1, description="bytes queued for one peer before its senders wait"
    )
    peer_outbound_submit_bytes: int = Field(
        4 * MiB,
        ge=1,
        description="bytes queued for one peer before submit() to it is refused (never below "
        "peer_outbound_bytes)",
    )
    admission_waiters: int = Field(
        1024, ge=1, description="callers waiting for room, per target and lane (python-api §9)"
    )
    io_workers: int = Field(16, ge=1, le=1024, description="threads for context.workers.io")
    cpu_workers: int | None = Field(None, ge=1, le=1024, description="None: one per core")
    worker_calls_in_flight: int = Field(1024, ge=1, description="io + cpu calls at once")
    shutdown_timeout: float = Field(10.0, ge=1e-3, le=1e7)
    relocation_payload_chunk_limit_bytes: int = Field(
        1024 * 1024, ge=16, description="largest chunk of a relocation payload on the wire"
    )
    status_interval: float = Field(
        1.0, ge=1e-3, le=1e7, description="seconds between status publications"
    )
    closing_timeout: float = Field(
        5.0, ge=1e-3, le=1e7, description="on_closing deadline (seconds)"
    )
    lease_seconds: float = Field(
        3.0, ge=0.25, le=1e7,
        description="node lease in the Location Store; renewed ~3x per lease. At least 0.25 s:"
        " a shorter one is not renewed in time (a store round trip and a thread hop), and the"
        " node fences itself over and over",
    )  # fmt: skip
    listen: str | None = Field(
        None,
        description="tcp://HOST:PORT this node serves peers and clients on; None: in-process "
        "only (python-api §10). Loopback unless insecure=True",
    )
    advertise: str | None = Field(
        None,
        description="the host other nodes and clients reach this node at (a host name or an "
        "IPv4 address), registered in place of listen's host, ports kept: for a wildcard or "
        "container listen address; None: listen's own host",
    )
    store: str = Field(
        "memory",
        description='Location Store: "memory" (one process), "sqlite:///PATH" (one machine) or'
        ' "redis://HOST:PORT/DB" (several machines)',
    )
    keys: str | None = Field(
        None, description="a keys folder (zlink keys generate): CURVE on every mesh socket"
    )
    insecure: bool = Field(
        False, description="allow a non-loopback listen address without CURVE keys (logged)"
    )
    data_frames_in_flight: int = Field(
        1024, ge=1, description="DATA frames sent to one peer and not yet taken there"
    )
    data_bytes_in_flight: int = Field(
        16 * MiB, ge=1024,
        description="bytes of those DATA frames (a larger frame still goes, alone)",
    )  # fmt: skip
    max_frame_bytes: int = Field(
        64 * MiB, ge=1024, description="largest frame taken from a peer or a client"
    )
    client_window_items: int = Field(
        1024, ge=1, description="sends a zlink.connect client may have without a verdict"
    )
    client_window_bytes: int = Field(
        16 * MiB, ge=1, description="payload bytes a client may have without a verdict"
    )
    client_calls_in_flight: int = Field(
        4096, ge=1, description="requests and creates a client may have without a reply"
    )
    idle_timeout: float | None = Field(
        None, ge=1e-3, le=1e7, description="close User/Instance Spots idle this long; None: never"
    )
    store_retention: float | None = Field(
        7 * 86400.0, ge=60.0, le=1e9,
        description="seconds after a dead node's lease lapsed that the Location Store rows it"
        " left go (python-api §10 'Failure'; swept by every node of a mesh); None: kept",
    )  # fmt: skip

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise InvalidArgument(f"invalid NodeConfig: {exc}") from exc

    @field_validator("node_id", "mesh")
    @classmethod
    def _check_id(cls, value: str) -> str:
        """Ids are valid UTF-8 of 1..255 bytes (python-api §1), printable: they name the
        node in the store, on the wire, in routing ids and in logs."""
        try:
            size = len(value.encode())
        except UnicodeEncodeError:
            raise ValueError("an id is valid UTF-8 (a lone surrogate is not)") from None
        if size > 255:
            raise ValueError(f"an id is at most 255 bytes of UTF-8, got {size}")
        if not value.isprintable():
            raise ValueError("an id is printable: no control, format or line characters")
        return value

    @field_validator("node_id")
    @classmethod
    def _check_node_id(cls, value: str) -> str:
        """A node id has no ``@``: an Entry Spot's id is ``TYPE@NODE`` (a probe found entry
        type ``lob@x`` on node ``y`` and entry type ``lob`` on node ``x@y`` share one id)."""
        if "@" in value:
            raise ValueError("a node id has no '@' (Entry Spot ids are TYPE@NODE)")
        return value

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return check_listen(value)
        except InvalidArgument as exc:
            raise ValueError(str(exc)) from None

    @field_validator("advertise")
    @classmethod
    def _check_advertise(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return check_advertise(value)
        except InvalidArgument as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _loopback_or_insecure(self) -> NodeConfig:
        if self.advertise is not None and self.listen is None:
            raise ValueError("advertise names where this node listens: it needs listen")
        remote = self.listen is not None and not is_loopback(self.listen)
        if remote and self.keys is None and not self.insecure:
            raise ValueError(
                f"listen {self.listen!r} is not a loopback address: a mesh on a network needs "
                "CURVE keys (keys=DIR, made by `zlink keys generate DIR`), or insecure=True "
                "(python-api §10)"
            )
        advertised = self.advertise is not None and not is_loopback(f"tcp://{self.advertise}:1")
        if advertised and self.keys is None and not self.insecure:
            raise ValueError(
                f"advertise {self.advertise!r} is not a loopback address: a node reached on a "
                "network needs CURVE keys (keys=DIR, made by `zlink keys generate DIR`), or "
                "insecure=True (python-api §10)"
            )
        return self

    def lane_limits(self) -> LaneLimits:
        """The per-owner lane limits these settings give."""
        return LaneLimits(
            self.app_lane_items,
            self.app_lane_bytes,
            self.app_retained_bytes_per_item,
            self.lifecycle_lane_items,
            self.lifecycle_lane_bytes,
            self.lifecycle_streak_cap,
            self.admission_waiters,
        )
