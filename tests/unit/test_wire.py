"""Typed node-to-node envelopes (``zlink.mesh.wire``): every kind round-trips, and anything
else is one typed ``WireError`` that says what the receiver may still answer."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from tests.unit.json_backends import backend  # noqa: F401 - applies to every test here
from zlink.errors import ErrorCode, InvalidArgument
from zlink.mesh import wire
from zlink.mesh.wire import (
    MAX_FRAME_BYTES,
    WIRE_VERSION,
    BatchEnvelope,
    CloseEnvelope,
    CreateEnvelope,
    DataAheadEnvelope,
    DroppedEnvelope,
    EncodedError,
    EncodedValue,
    Envelope,
    EnvelopeKind,
    EventMark,
    EventStamp,
    FencedEnvelope,
    FenceEnvelope,
    JoinAnswer,
    JoinAskEnvelope,
    JoinGrant,
    RelayedEnvelope,
    RelocAbortEnvelope,
    RelocChunkEnvelope,
    RelocCommitEnvelope,
    RelocDoneEnvelope,
    RelocEnvelope,
    RelocMessageJob,
    RelocObject,
    RelocOpenedEnvelope,
    RelocTickJob,
    RelocTimer,
    ReplyEnvelope,
    RequestEnvelope,
    RouteEnvelope,
    SendEnvelope,
    WireError,
    decode,
    dump_record,
    encode,
    load_record,
    maker,
)
from zlink.messaging import codec
from zlink.timers import OverrunPolicy

REQUEST = RequestEnvelope(
    target_kind="spot", target="room-1", message_type="t.w.move", payload='{"x":1,"s":"é 🎲"}',
    meta={"trace": "abc"}, origin_node="n2", first_origin="n1", via="n2", hops=1,
    instance=True, instance_type="t.w.room", correlation=17, deadline=2.5,
)  # fmt: skip
JOBS = (
    RelocMessageJob("t.w.move", '{"x":2}', None, "sender-1", 9, None, None, False),
    RelocTickJob("heartbeat", 4, 0.5, 0.25, 2),
    RelocMessageJob("t.w.news", '{"n":1}', {"k": "v"}, None, None, "topic-a", None, False),
    RelocMessageJob("t.w.move", '{"x":3}', None, None, None, None, "node-7", True),
)
TIMERS = (
    RelocTimer("heartbeat", 0.5, OverrunPolicy.CATCH_UP_BOUNDED, 3, True, 0.3, 4, 2, 2),
    RelocTimer("slow", 60.0, OverrunPolicy.SKIP_LATE_TICKS, 1, False, -1.5, 0, 0, 0),
)
RELOC = RelocEnvelope(
    source_node="n1", relocation_id=3, target="room-1", spot_type="t.w.room",
    object_generation=12, chunk_count=2,
    objects=(
        RelocObject("room-1", "t.w.room", JOBS, TIMERS, ("topic-a", "news/é 🎲"),
                    (EventMark("n2", "topic-a", 7, 2, 41),)),
        RelocObject("actor-1", "t.w.player", (), (), (), ()),
    ),
    signaled=True, unit="spot", join=None,
)  # fmt: skip

SAMPLES: dict[str, Envelope] = {
    "send": SendEnvelope(
        target_kind="actor",
        target="a-1",
        message_type="t.w.ping",
        payload="{}",
        meta=None,
        origin_node="n1",
        first_origin="n1",
        via="n1",
        hops=0,
        instance=False,
        instance_type=None,
        event=None,
    ),
    "event": SendEnvelope(
        target_kind="topic",
        target="news",
        message_type="t.w.news",
        payload='{"n":1}',
        meta=None,
        origin_node="n1",
        first_origin="n1",
        via="n1",
        hops=0,
        instance=False,
        instance_type=None,
        event=EventStamp(incarnation=3, epoch=1, number=12),
    ),
    "request": REQUEST,
    "reply-value": ReplyEnvelope(correlation=17, value='{"ok":true}', error=None),
    "reply-null": ReplyEnvelope(correlation=18, value="null", error=None),
    "reply-error": ReplyEnvelope(
        correlation=19,
        value=None,
        error=EncodedError(ErrorCode.HANDLER_ERROR, "KeyError", "'missing'"),
    ),
    "route": RouteEnvelope(
        target="room-1", route_node="n3", object_generation=12, authority_generation=4
    ),
    "dropped": DroppedEnvelope(
        target="room-1", message_type="t.w.ping", reason="lane_full", count=3
    ),
    "batch": BatchEnvelope(
        target_kind="spot",
        target="room-1",
        message_types=("t.w.ping", "t.w.ping"),
        payloads=("{}", '{"n":1}'),
        origin_node="n1",
        first_origin="n1",
        via="n1",
        hops=0,
    ),
    "fence": FenceEnvelope(target="room-1", first_origin="n1", via="n2", hops=2),
    "fence-marked": FenceEnvelope(target="room-1", first_origin="n1", via="n2", hops=2, mark=9),
    "relayed": RelayedEnvelope(correlation=19, node="n3", hops=2, relay="n2"),
    "relayed-taken": RelayedEnvelope(correlation=19, node="n3", hops=2, relay=None),
    "fenced-owner": FencedEnvelope(target="room-1", owner_node="n3"),
    "fenced-gone": FencedEnvelope(target="room-1", owner_node=None),
    "data_ahead-fence": DataAheadEnvelope(
        announces=EnvelopeKind.FENCE,
        target="room-1",
        first_origin="n1",
        via="n2",
        mark=2**40 + 7,
    ),
    "data_ahead-reloc": DataAheadEnvelope(
        announces=EnvelopeKind.RELOC_CHUNK, target="", first_origin="n1", via="n1", mark=3
    ),
    "reloc_chunk-marked": RelocChunkEnvelope(
        source_node="n1", relocation_id=3, index=1, chunk="AAEC", mark=4
    ),
    "create": CreateEnvelope(
        target="room-9", spot_type="t.w.room", origin_node="n1", correlation=5, hops=0
    ),
    "close": CloseEnvelope(
        target="room-9",
        object_generation=2**63 - 1,
        origin_node="n1",
        correlation=6,
        hops=1,
        deadline=2.5,
    ),
    "reloc_chunk": RelocChunkEnvelope(
        source_node="n1", relocation_id=3, index=0, chunk='{"room-1":"AAEC'
    ),
    "reloc": RELOC,
    "reloc-join": dataclasses.replace(
        RELOC,
        unit="actor",
        objects=RELOC.objects[1:],
        signaled=False,
        join=JoinGrant(EncodedValue("t.w.welcome", '{"text":"hi"}')),
    ),
    "reloc-join-no-reply": dataclasses.replace(RELOC, unit="actor", join=JoinGrant(None)),
    "reloc_done-ok": RelocDoneEnvelope(relocation_id=3, error=None),
    "reloc_done-failed": RelocDoneEnvelope(relocation_id=3, error="restore failed 3 times"),
    "reloc_done-refused": RelocDoneEnvelope(relocation_id=3, error="draining", refused=True),
    "reloc_commit": RelocCommitEnvelope(
        source_node="n1", relocation_id=3, authority={"room-1": 5, "actor-1": 2}
    ),
    "reloc_opened": RelocOpenedEnvelope(relocation_id=3),
    "reloc_abort": RelocAbortEnvelope(source_node="n1", relocation_id=3),
    "join_ask": JoinAskEnvelope(
        target="room-1",
        actor_id="a-1",
        origin_node="n1",
        correlation=8,
        hops=0,
        request=EncodedValue(None, '{"seat":3}'),
    ),
    "join_ask-no-request": JoinAskEnvelope(
        target="room-1", actor_id="a-1", origin_node="n1", correlation=8, hops=1, request=None
    ),
}


def _frame(envelope: Envelope) -> dict[str, Any]:
    """An envelope's encoded frame as a plain JSON object, to be spoiled by a test."""
    frame: dict[str, Any] = json.loads(encode(envelope))
    return frame


def _bytes(frame: object) -> bytes:
    return json.dumps(frame).encode()


def _refused(data: bytes) -> WireError:
    with pytest.raises(WireError) as caught:
        decode(data)
    return caught.value


# -- round trips ---------------------------------------------------------------------------------


def test_the_samples_cover_every_kind() -> None:
    assert {type(e).KIND for e in SAMPLES.values()} == set(EnvelopeKind)
    assert {cls.KIND for cls in wire.ENVELOPE_CLASSES} == set(EnvelopeKind)
    assert len(wire.ENVELOPE_CLASSES) == len(EnvelopeKind)  # one class per kind


@pytest.mark.parametrize("name", SAMPLES)
def test_every_kind_round_trips(name: str) -> None:
    envelope = SAMPLES[name]
    data = encode(envelope)
    assert isinstance(data, bytes)
    back = decode(data)
    assert back == envelope
    assert type(back) is type(envelope)
    assert encode(back) == data  # stable: a relayed envelope encodes the same


@pytest.mark.parametrize("name", SAMPLES)
def test_the_fast_constructor_builds_what_the_class_builds(name: str) -> None:
    envelope = SAMPLES[name]
    values = [getattr(envelope, f.name) for f in dataclasses.fields(envelope)]
    made = maker(type(envelope))(*values)
    assert made == envelope and type(made) is type(envelope)
    assert encode(made) == encode(envelope)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, dataclasses.fields(made)[0].name, None)


@pytest.mark.parametrize("name", SAMPLES)
def test_every_frame_carries_the_version_and_the_kind(name: str) -> None:
    envelope = SAMPLES[name]
    frame = _frame(envelope)
    assert frame["version"] == WIRE_VERSION == 11
    assert frame["kind"] == type(envelope).KIND.value
    names = {f.name for f in dataclasses.fields(envelope)}
    assert set(frame) == names | {"version", "kind"}  # every field is present, even null


def test_nested_records_keep_their_types() -> None:
    back = decode(encode(RELOC))
    assert isinstance(back, RelocEnvelope)
    jobs = back.objects[0].jobs
    assert [type(j) for j in jobs] == [RelocMessageJob, RelocTickJob, RelocMessageJob,
                                       RelocMessageJob]  # fmt: skip
    assert isinstance(back.objects[0].timers, tuple)
    assert back.objects[0].timers[0].overrun_policy is OverrunPolicy.CATCH_UP_BOUNDED
    reply = decode(encode(SAMPLES["reply-error"]))
    assert isinstance(reply, ReplyEnvelope) and reply.error is not None
    assert reply.error.code is ErrorCode.HANDLER_ERROR


def test_a_moved_spots_subscriptions_cross_with_it() -> None:
    """A relocated Spot's Logical Multicast topics travel in its record, in order, as a
    tuple of str; an object with none carries an empty tuple."""
    frame = _frame(RELOC)
    assert frame["objects"][0]["topics"] == ["topic-a", "news/é 🎲"]
    assert frame["objects"][1]["topics"] == []
    back = decode(encode(RELOC))
    assert isinstance(back, RelocEnvelope)
    assert back.objects[0].topics == ("topic-a", "news/é 🎲")
    assert back.objects[1].topics == ()


def test_an_int_is_taken_for_a_float_and_comes_back_a_float() -> None:
    frame = _frame(REQUEST)
    frame["deadline"] = 5
    back = decode(_bytes(frame))
    assert isinstance(back, RequestEnvelope)
    assert type(back.deadline) is float and back.deadline == 5.0


def test_a_relayed_copy_is_a_new_frozen_envelope() -> None:
    relayed = dataclasses.replace(REQUEST, hops=REQUEST.hops + 1, via="n3")
    assert decode(encode(relayed)) == relayed
    with pytest.raises(dataclasses.FrozenInstanceError):
        REQUEST.hops = 5  # type: ignore[misc]


def test_reloc_done_says_ok_when_it_carries_no_error() -> None:
    assert RelocDoneEnvelope(1, None).ok
    assert not RelocDoneEnvelope(1, "no").ok


def test_a_join_answer_crosses_as_a_reply_value() -> None:
    answer = JoinAnswer(True, EncodedValue("t.w.welcome", '{"text":"hi"}'), "", "n2")
    reply = ReplyEnvelope(
        correlation=4, value=codec.dumps(dump_record(answer)).decode(), error=None
    )
    back = decode(encode(reply))
    assert isinstance(back, ReplyEnvelope) and back.value is not None
    assert load_record(JoinAnswer, codec.loads(back.value)) == answer


def test_a_bad_join_answer_is_a_wire_error_naming_the_field() -> None:
    good = dump_record(JoinAnswer(False, None, "closed", "n2"))
    with pytest.raises(WireError) as caught:
        load_record(JoinAnswer, {**good, "accept": 1})
    assert caught.value.field == "accept"
    with pytest.raises(WireError):
        load_record(JoinAnswer, [good])
    with pytest.raises(WireError):
        load_record(RequestEnvelope, _frame(REQUEST))  # envelopes go through decode()


# -- frames that are not envelopes ---------------------------------------------------------------


def test_wire_error_is_a_typed_invalid_argument() -> None:
    error = _refused(b"\x00")
    assert isinstance(error, InvalidArgument)
    assert isinstance(error, ValueError)
    assert error.code is ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    "data",
    [b"", b"\x00\xff\xfe garbage", b"not json", b"{'single': 'quotes'}", b"\xff\xfe{}",
     b'{"version":1,"kind":"fenced","target":"\xff\xfe","owner_node":null}',
     b"[" * 100_000],
)  # fmt: skip
def test_garbage_is_refused(data: bytes) -> None:
    error = _refused(data)
    assert error.kind is None
    assert error.reply_route is None


@pytest.mark.parametrize("name", ["request", "reloc", "join_ask"])
def test_every_truncation_is_refused(name: str) -> None:
    data = encode(SAMPLES[name])
    for end in range(len(data)):
        with pytest.raises(WireError):
            decode(data[:end])


@pytest.mark.parametrize("data", [b"[]", b"[1, 2]", b"1", b"2.5", b'"send"', b"null", b"true"])
def test_json_that_is_not_an_object_is_refused(data: bytes) -> None:
    error = _refused(data)
    assert "object" in str(error)
    assert error.reply_route is None


def test_a_frame_that_is_not_bytes_is_refused() -> None:
    with pytest.raises(WireError):
        decode(encode(REQUEST).decode())  # type: ignore[arg-type]


@pytest.mark.parametrize("version", [0, 1, 10, 12, "11", 11.0, True, None, [11]])
def test_an_unknown_version_is_refused_and_its_caller_answered(version: object) -> None:
    """Issue 13: an unknown-version envelope is dropped, and a reply route still gets a typed
    error (its sender may be waiting); nothing else in it is trusted."""
    frame = _frame(REQUEST)
    frame["version"] = version
    error = _refused(_bytes(frame))
    assert "version" in str(error)
    assert error.kind is None
    assert error.reply_route == (REQUEST.origin_node, REQUEST.correlation)


def test_a_missing_version_is_refused() -> None:
    frame = _frame(REQUEST)
    del frame["version"]
    assert "version" in str(_refused(_bytes(frame)))


@pytest.mark.parametrize("kind", ["teleport", "Send", "", 1, None, ["send"]])
def test_an_unknown_kind_is_refused(kind: object) -> None:
    frame = _frame(SAMPLES["send"])
    frame["kind"] = kind
    error = _refused(_bytes(frame))
    assert "kind" in str(error)
    assert error.kind is None


def test_an_unknown_kind_still_names_its_reply_route() -> None:
    frame = _frame(REQUEST)
    frame["kind"] = "request_v2"
    error = _refused(_bytes(frame))
    assert error.kind is None
    assert error.reply_route == ("n2", 17)


def test_a_missing_kind_is_refused() -> None:
    frame = _frame(REQUEST)
    del frame["kind"]
    assert _refused(_bytes(frame)).kind is None


_FIELDS = [
    (name, field.name)
    for name, envelope in SAMPLES.items()
    for field in dataclasses.fields(envelope)
]


@pytest.mark.parametrize(("name", "field"), _FIELDS)
def test_every_missing_field_is_refused_by_name(name: str, field: str) -> None:
    envelope = SAMPLES[name]
    frame = _frame(envelope)
    del frame[field]
    error = _refused(_bytes(frame))
    assert error.kind is type(envelope).KIND
    assert error.field == field
    assert field in str(error)


def test_a_missing_nested_field_is_refused_with_its_path() -> None:
    frame = _frame(RELOC)
    del frame["objects"][0]["jobs"][1]["sequence"]
    error = _refused(_bytes(frame))
    assert error.field == "objects[0].jobs[1].sequence"


def test_an_unknown_field_is_refused() -> None:
    frame = _frame(SAMPLES["fence"])
    frame["priority"] = 1
    error = _refused(_bytes(frame))
    assert "priority" in str(error)
    assert error.kind is EnvelopeKind.FENCE
    frame = _frame(RELOC)
    frame["objects"][1]["extra"] = None
    assert "extra" in str(_refused(_bytes(frame)))


WRONG: list[tuple[str, str, object]] = [
    ("request", "hops", True),  # a bool is never an int
    ("request", "hops", False),
    ("request", "correlation", True),
    ("request", "hops", 1.5),
    ("request", "hops", "1"),
    ("request", "hops", None),
    ("request", "target", 5),
    ("request", "target", None),
    ("request", "payload", {"x": 1}),  # the payload is JSON text, not an object
    ("request", "instance", 1),
    ("request", "instance", "true"),
    ("request", "instance_type", 3),
    ("request", "deadline", True),
    ("request", "deadline", "2.5"),
    ("request", "deadline", None),
    ("request", "meta", ["trace"]),
    ("request", "meta", {"trace": 1}),
    ("request", "meta", "trace=abc"),
    ("request", "target_kind", "planet"),
    ("send", "origin_node", None),
    ("reply-value", "value", 5),
    ("reply-value", "value", None),  # then it has neither a value nor an error
    ("reply-value", "error", {"code": "UNAVAILABLE", "error_type": "X", "message": "m"}),
    ("reply-error", "error", {"code": "NO_SUCH_CODE", "error_type": "X", "message": "m"}),
    ("reply-error", "error", {"code": "UNAVAILABLE", "error_type": 1, "message": "m"}),
    ("reply-error", "error", "UNAVAILABLE"),
    ("route", "authority_generation", [1, 2]),
    ("route", "object_generation", False),
    ("fenced-owner", "owner_node", 7),
    ("create", "correlation", "5"),
    ("reloc_chunk", "index", True),
    ("reloc", "objects", {}),
    ("reloc", "objects", [None]),
    ("reloc", "signaled", 0),
    ("reloc", "unit", "galaxy"),
    ("reloc", "join", {"reply": {"message_type": None}}),
    ("reloc", "join", True),
    ("reloc_done-ok", "error", False),
    ("reloc_commit", "authority", {"room-1": True}),
    ("reloc_commit", "authority", {"room-1": "5"}),
    ("reloc_commit", "authority", [["room-1", 5]]),
    ("reloc_opened", "relocation_id", 3.0),
    ("reloc_abort", "source_node", None),
    ("join_ask", "request", '{"seat":3}'),
    ("join_ask", "request", {"message_type": None, "payload": 3}),
]


@pytest.mark.parametrize(("name", "field", "value"), WRONG)
def test_a_wrong_typed_field_is_refused(name: str, field: str, value: object) -> None:
    envelope = SAMPLES[name]
    frame = _frame(envelope)
    frame[field] = value
    error = _refused(_bytes(frame))
    assert error.kind is type(envelope).KIND
    assert (error.field or "").startswith(field) or name.startswith("reply")


@pytest.mark.parametrize(
    ("spoil", "path"),
    [
        (lambda f: f["objects"][0]["jobs"][1].update(sequence=True), "objects[0].jobs[1].sequence"),
        (lambda f: f["objects"][0]["jobs"][0].update(kind="email"), "objects[0].jobs[0]"),
        (lambda f: f["objects"][0]["jobs"][0].pop("kind"), "objects[0].jobs[0]"),
        (lambda f: f["objects"][0]["jobs"][2].update(meta={"k": None}), "objects[0].jobs[2].meta"),
        (lambda f: f["objects"][0]["timers"][0].update(overrun_policy="sometimes"),
         "objects[0].timers[0].overrun_policy"),
        (lambda f: f["objects"][0]["timers"][1].update(interval="60"),
         "objects[0].timers[1].interval"),
        (lambda f: f["objects"][1].update(jobs=None), "objects[1].jobs"),
        (lambda f: f["objects"][0].update(topics="topic-a"), "objects[0].topics"),
        (lambda f: f["objects"][0].update(topics=["topic-a", 1]), "objects[0].topics"),
        (lambda f: f["objects"][1].pop("topics"), "objects[1].topics"),
    ],
)  # fmt: skip
def test_a_wrong_nested_field_is_refused_with_its_path(spoil: Any, path: str) -> None:
    frame = _frame(RELOC)
    spoil(frame)
    error = _refused(_bytes(frame))
    assert error.kind is EnvelopeKind.RELOC
    assert error.field is not None and error.field.startswith(path)


@pytest.mark.parametrize("token", [b"NaN", b"Infinity", b"-Infinity", b"1e999"])
def test_a_float_that_is_not_finite_is_refused(token: bytes) -> None:
    data = encode(REQUEST).replace(b'"deadline":2.5', b'"deadline":' + token)
    assert b'"deadline":' + token in data
    with pytest.raises(WireError):  # not JSON for orjson, a non-finite float for json
        decode(data)


def test_a_reply_with_both_a_value_and_an_error_cannot_be_built() -> None:
    with pytest.raises(WireError):
        ReplyEnvelope(correlation=1, value="1", error=EncodedError(ErrorCode.CANCELLED, "X", ""))
    with pytest.raises(WireError):
        ReplyEnvelope(correlation=1, value=None, error=None)


# -- the frame size ------------------------------------------------------------------------------


def test_a_frame_over_the_limit_is_refused_before_it_is_parsed() -> None:
    assert MAX_FRAME_BYTES == 64 * 1024 * 1024
    error = _refused(b" " * (MAX_FRAME_BYTES + 1))
    assert str(MAX_FRAME_BYTES) in str(error)


def test_frames_over_a_lower_limit_are_refused_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    big = dataclasses.replace(REQUEST, payload='"' + "x" * 2_000 + '"')
    data = encode(big)
    assert decode(data) == big
    monkeypatch.setattr(wire, "MAX_FRAME_BYTES", 1_000)
    with pytest.raises(WireError):
        decode(data)
    with pytest.raises(WireError) as caught:
        encode(big)
    assert caught.value.kind is EnvelopeKind.REQUEST
    assert decode(encode(REQUEST)) == REQUEST  # a small one still crosses


# -- what an encode refuses ----------------------------------------------------------------------


@pytest.mark.parametrize("deadline", [float("inf"), float("-inf"), float("nan")])
def test_a_non_finite_float_does_not_encode(deadline: float) -> None:
    with pytest.raises(WireError) as caught:
        encode(dataclasses.replace(REQUEST, deadline=deadline))
    assert caught.value.field == "deadline"
    assert caught.value.kind is EnvelopeKind.REQUEST


def test_a_non_finite_nested_float_does_not_encode() -> None:
    timer = dataclasses.replace(TIMERS[0], due_in=float("inf"))
    spot = dataclasses.replace(RELOC.objects[0], timers=(timer,))
    with pytest.raises(WireError) as caught:
        encode(dataclasses.replace(RELOC, objects=(spot,)))
    assert caught.value.field == "objects[0].timers[0].due_in"


def test_only_envelopes_encode() -> None:
    with pytest.raises(WireError):
        encode({"k": "send"})  # type: ignore[arg-type]
    with pytest.raises(WireError):
        encode(TIMERS[0])  # type: ignore[arg-type]


# -- the reply route -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "route"),
    [("request", ("n2", 17)), ("create", ("n1", 5)), ("join_ask", ("n1", 8))],
)
def test_a_bad_call_still_names_where_to_answer(name: str, route: tuple[str, int]) -> None:
    frame = _frame(SAMPLES[name])
    frame["hops"] = True
    error = _refused(_bytes(frame))
    assert error.reply_route == route
    assert error.correlation == route[1]


def test_a_bad_payload_field_of_a_request_can_be_answered() -> None:
    frame = _frame(REQUEST)
    del frame["payload"]
    assert _refused(_bytes(frame)).reply_route == ("n2", 17)


@pytest.mark.parametrize(
    "spoil",
    [
        {"origin_node": None},
        {"origin_node": 2},
        {"origin_node": ""},
        {"correlation": True},
        {"correlation": "17"},
        {"correlation": 17.0},
    ],
)
def test_no_reply_route_without_a_decodable_origin_and_correlation(spoil: dict[str, Any]) -> None:
    frame = _frame(REQUEST)
    frame.update(spoil)
    frame["hops"] = True  # refused anyway (an empty origin is a str, but no route)
    error = _refused(_bytes(frame))
    assert error.kind is EnvelopeKind.REQUEST
    assert error.reply_route is None


def test_no_reply_route_when_the_route_field_is_missing() -> None:
    frame = _frame(REQUEST)
    del frame["origin_node"]
    assert _refused(_bytes(frame)).reply_route is None
    frame = _frame(REQUEST)
    del frame["correlation"]
    assert _refused(_bytes(frame)).reply_route is None


def test_no_reply_route_for_a_one_way_send() -> None:
    frame = _frame(SAMPLES["send"])
    frame["hops"] = "x"
    frame_with_id = {**frame, "correlation": 4}  # an unknown field: still no one is waiting
    assert _refused(_bytes(frame)).reply_route is None
    assert _refused(_bytes(frame_with_id)).reply_route is None


def test_a_bad_reply_names_the_call_it_answers_but_has_no_route() -> None:
    frame = _frame(SAMPLES["reply-value"])
    frame["value"] = 3
    error = _refused(_bytes(frame))
    assert error.kind is EnvelopeKind.REPLY
    assert error.correlation == 17
    assert error.reply_route is None


# -- the generated fast paths agree with the precise ones (internals) -----------------------------


@pytest.mark.parametrize("name", SAMPLES)
def test_the_generated_and_the_precise_paths_agree_on_good_frames(name: str) -> None:
    envelope = SAMPLES[name]
    record = wire._BY_CLASS[type(envelope)][1]
    frame = _frame(envelope)
    assert record.fast_decode(frame) == record.decode(frame) == envelope
    assert record.fast_encode(envelope) == record.encode(envelope) == frame


@pytest.mark.parametrize(("name", "field", "value"), WRONG)
def test_the_generated_and_the_precise_paths_both_refuse_bad_frames(
    name: str, field: str, value: object
) -> None:
    envelope = SAMPLES[name]
    record = wire._BY_CLASS[type(envelope)][1]
    frame = _frame(envelope)
    frame[field] = value
    with pytest.raises(wire._FAILED):
        record.fast_decode(frame)
    with pytest.raises(wire._Bad):
        record.decode(frame)


def test_a_value_json_cannot_carry_reads_the_same_on_both_backends() -> None:
    """A user reads the same words whichever backend the interpreter has (3.13t has no orjson)."""
    with pytest.raises(TypeError, match=r"^Type is not JSON serializable: set$"):
        codec.dumps({"seen": {1, 2}})
