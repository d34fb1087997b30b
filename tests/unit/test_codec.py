"""``zlink.messaging.codec``: one contract on both backends (orjson; the standard ``json`` where
orjson has no wheel, as on 3.13t), including the standard path's own fast encoder and scanner."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.unit.json_backends import backend  # noqa: F401 - applies to every test here
from zlink.messaging import codec

VALUES: list[Any] = [
    {"version": 4, "kind": "send", "payload": '{"x":1,"s":"é 🎲"}', "meta": None, "hops": 0},
    [1, 2.5, -3, True, False, None, "", 'a"b\\c\n\u2028'],
    {"nested": {"deep": [{"k": [[]]}]}, "empty": {}},
    "just a string",
    12345678901234567890,
    0.1,
]


@pytest.mark.parametrize("value", VALUES)
def test_compact_utf8_json_that_reads_back_the_same(value: Any) -> None:
    data = codec.dumps(value)
    assert type(data) is bytes
    assert data == json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    assert codec.loads(data) == value
    assert codec.loads(data.decode()) == value
    assert codec.loads(memoryview(data)) == value  # (a frame as ZeroMQ hands it over)


def test_whitespace_around_a_value_is_fine_and_extra_data_is_not() -> None:
    assert codec.loads(b' \n{"a": [1, 2]}\t ') == {"a": [1, 2]}
    assert codec.loads(b"[1] ") == [1]
    for bad in (b'{"a":1} x', b"[1][2]", b"", b"   ", b"{", b'"open', b"\xff\xfe{}", b"nul"):
        with pytest.raises(ValueError):
            codec.loads(bad)


def test_a_value_json_cannot_carry_and_a_cycle_are_refused_with_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"^Type is not JSON serializable: set$"):
        codec.dumps({"seen": {1, 2}})
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises((TypeError, ValueError)):
        codec.dumps(loop)


def test_a_message_from_the_wire_is_validated_once_and_a_bad_one_is_a_typed_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A message's own ``__init__`` (what ``BaseModel.__init__`` does) is not run again on a
    payload pydantic has just validated; a bad payload is still ``InvalidArgument``."""
    import zlink
    from zlink.messaging.message import from_wire, to_wire

    class Bump(zlink.Message, type_name="t.codec.bump"):
        n: int

    calls: list[int] = []
    original = zlink.Message.__init__

    def counting(self: zlink.Message, /, **data: Any) -> None:
        calls.append(1)
        original(self, **data)

    monkeypatch.setattr(zlink.Message, "__init__", counting)
    assert Bump.__pydantic_custom_init__ is False
    assert from_wire(*to_wire(Bump(n=3))) == Bump(n=3)
    assert len(calls) == 2  # the two made here, none by the decode
    with pytest.raises(zlink.InvalidArgument, match=r"t\.codec\.bump"):
        from_wire("t.codec.bump", '{"n":"three"}')
