"""The ClientServer frames (``zlink.mesh.client_wire``): every kind crosses intact, and
anything else is refused with one typed ``FrameError`` that says why and, where it could be
read, names the frame's kind and first number (so the node can answer the caller)."""

from __future__ import annotations

import pytest

from zlink.errors import ErrorCode, InvalidArgument
from zlink.mesh import client_wire as cw
from zlink.mesh.wire import EncodedError
from zlink.types import TargetKind

ERR = EncodedError(ErrorCode.NOT_FOUND, "NotFound", "no spot 'x'")
FRAMES: list[cw.ClientFrame] = [
    cw.Hello(0, "123@host"),
    cw.Welcome(0, "n1", "main", 1024, 1 << 24, 4096, 30.0, 2.5, 1 << 26, (), 1.0),
    cw.Welcome(
        0,
        "n1",
        "main",
        1024,
        1 << 24,
        4096,
        30.0,
        2.5,
        1 << 26,
        ("tcp://127.0.0.1:7102", "tcp://[::1]:7103"),
        0.5,
    ),
    cw.Send(1, TargetKind.SPOT, "r", "t.note", None, False, None, None, b'{"n":1}'),
    cw.Send(2, TargetKind.TOPIC, "news", "t.news", {"k": "v"}, True, "t.i", 0.25, b""),
    cw.Send(4, TargetKind.SPOT, "r", "t.note", None, False, None, 0.0, b'{"n":2}'),
    cw.Batch(3, TargetKind.ACTOR, "a", ("t.x", "t.y"), None, (b"{}", b'{"z":[1,2]}')),
    cw.Batch(4, TargetKind.SPOT, "r", ("t.x",), 1.5, (b"",)),
    cw.Request(5, TargetKind.CHANNEL, "api", "t.echo", None, False, None, 2.0, b'{"t":"\xc3\xa9"}'),
    cw.Create(6, TargetKind.ACTOR, "t.player", "p-1", True, "t.hi", "main", 5.0, b"{}"),
    cw.Create(7, TargetKind.SPOT, "t.room", None, False, None, None, 5.0, b""),
    cw.Close(8, "r", 2**63 - 1, "main", "n1"),
    cw.Reply(9, None, b'{"ok":true}'),
    cw.Reply(10, ERR, b""),
    cw.Acks(((1, 4), (6, 6)), (cw.Failure(5, cw.DropReason.LANE_FULL, ERR),)),
    cw.Acks((), ()),
    cw.Bye("the node shuts down"),
    cw.Pack((cw.encode(cw.Hello(1, "a")), cw.encode(cw.Bye("b")))),
]


@pytest.mark.parametrize("frame", FRAMES, ids=lambda f: type(f).__name__)
def test_every_kind_crosses_intact(frame: cw.ClientFrame) -> None:
    data = cw.encode(frame)
    assert data[0] == cw.CLIENT_VERSION and data[1] == frame.KIND
    assert cw.decode(data) == frame


def test_a_float_field_takes_an_int_and_the_precise_path_agrees() -> None:
    head = b'[5,"spot","r","t.echo",null,false,null,2]'
    frame = cw.decode(
        cw.HEADER.pack(cw.CLIENT_VERSION, cw.ClientKind.REQUEST, len(head)) + head + b"{}"
    )
    assert isinstance(frame, cw.Request) and frame.deadline == 2.0


def _frame(kind: int, head: bytes, tail: bytes = b"", version: int = cw.CLIENT_VERSION) -> bytes:
    return cw.HEADER.pack(version, kind, len(head)) + head + tail


REQ = cw.ClientKind.REQUEST
BAD: list[tuple[bytes, cw.BadFrame, cw.ClientKind | None, int | None]] = [
    (b"", cw.BadFrame.TRUNCATED, None, None),
    (b"\x01\x05", cw.BadFrame.TRUNCATED, None, None),
    (_frame(REQ, b"[1]")[:-1], cw.BadFrame.TRUNCATED, REQ, None),
    (_frame(REQ, b"[1]", version=cw.CLIENT_VERSION + 1), cw.BadFrame.VERSION, None, None),
    (_frame(0, b"[]"), cw.BadFrame.KIND, None, None),
    (_frame(200, b"[]"), cw.BadFrame.KIND, None, None),
    (_frame(REQ, b"\xff\xfe"), cw.BadFrame.GARBAGE, REQ, None),
    (_frame(REQ, b'{"a":1}'), cw.BadFrame.GARBAGE, REQ, None),
    (_frame(REQ, b"[7]"), cw.BadFrame.GARBAGE, REQ, 7),  # too few fields
    (_frame(REQ, b'[7,"spot","r","t",null,false,null,1.0,1]'), cw.BadFrame.GARBAGE, REQ, 7),
    (_frame(REQ, b'[7,"spot","r","t",null,1,null,1.0]'), cw.BadFrame.FIELD, REQ, 7),  # bool
    (_frame(REQ, b'[7,"room","r","t",null,false,null,1.0]'), cw.BadFrame.FIELD, REQ, 7),
    (_frame(REQ, b'[7,"spot",3,"t",null,false,null,1.0]'), cw.BadFrame.FIELD, REQ, 7),
    (_frame(REQ, b'[7,"spot","r","t",{"k":1},false,null,1.0]'), cw.BadFrame.FIELD, REQ, 7),
    (_frame(REQ, b'[7,"spot","r","t",null,false,null,"soon"]'), cw.BadFrame.FIELD, REQ, 7),
    (_frame(REQ, b'[true,"spot","r","t",null,false,null,1.0]'), cw.BadFrame.FIELD, REQ, None),
    (_frame(REQ, b'[-1,"spot","r","t",null,false,null,1.0]'), cw.BadFrame.FIELD, REQ, None),
    (_frame(cw.ClientKind.BYE, b'["x"]', b"tail"), cw.BadFrame.FIELD, cw.ClientKind.BYE, None),
    (  # batch sizes that do not add up to its tail
        _frame(cw.ClientKind.BATCH, b'[3,"spot","r",["t"],null,[5]]', b"{}"),
        cw.BadFrame.FIELD,
        cw.ClientKind.BATCH,
        3,
    ),
    (_frame(cw.ClientKind.ACKS, b"[[[5,1]],[]]"), cw.BadFrame.FIELD, cw.ClientKind.ACKS, None),
    (
        _frame(cw.ClientKind.ACKS, b'[[],[[1,"lost",["NOT_FOUND","N","m"]]]]'),
        cw.BadFrame.FIELD,
        cw.ClientKind.ACKS,
        None,
    ),
    (
        _frame(cw.ClientKind.REPLY, b'[9,["NOPE","N","m"]]'),
        cw.BadFrame.FIELD,
        cw.ClientKind.REPLY,
        9,
    ),
]


@pytest.mark.parametrize("data, reason, kind, first", BAD)
def test_anything_else_is_refused_typed(
    data: bytes, reason: cw.BadFrame, kind: cw.ClientKind | None, first: int | None
) -> None:
    with pytest.raises(cw.FrameError) as info:
        cw.decode(data)
    assert isinstance(info.value, InvalidArgument)
    assert (info.value.reason, info.value.kind, info.value.first) == (reason, kind, first)


def test_ranges_and_drop_reasons() -> None:
    from zlink.errors import DeadlineExceeded, NotFound, ResourceExhausted, Unavailable
    from zlink.mesh.client_server import drop_reason, ranges

    assert ranges([5, 1, 2, 3, 9, 8]) == ((1, 3), (5, 5), (8, 9))
    assert ranges([]) == ()
    assert drop_reason(NotFound("x")) is cw.DropReason.NOT_FOUND
    assert drop_reason(ResourceExhausted("x")) is cw.DropReason.LANE_FULL
    assert drop_reason(DeadlineExceeded("x")) is cw.DropReason.NO_ROOM_IN_TIME
    assert drop_reason(InvalidArgument("x")) is cw.DropReason.BAD_PAYLOAD
    assert drop_reason(Unavailable("x")) is cw.DropReason.UNAVAILABLE
    assert drop_reason(RuntimeError("x")) is cw.DropReason.REFUSED
