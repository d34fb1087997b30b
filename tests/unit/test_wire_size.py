"""What lane admission reserves for a payload (execution-model §7: bytes on the wire)."""

from __future__ import annotations

import pytest

import zlink
from zlink.messaging.message import wire_bytes, wire_size, wire_size_many


class Plain(zlink.Message, type_name="t.ws.plain"):
    n: int = 0


class Rich(zlink.Message, type_name="t.ws.rich"):
    text: str = ""
    values: list[float] = []
    nested: dict[str, list[int]] = {}
    maybe: Plain | None = None


SAMPLES: list[zlink.Message] = [
    Rich(text='quote " back\\slash \n tab\t', values=[0.1, 1e300, -0.0]),
    Rich(text="한국어 🎲 ünïcode", nested={"a": [1, 2], "": []}, maybe=Plain(n=-7)),
    Rich(),
    Rich(text="x" * 10_000),
]


@pytest.mark.parametrize("msgs", [SAMPLES, SAMPLES[:1], [Plain(n=i) for i in range(50)]])
def test_a_batch_of_one_type_reserves_exactly_what_its_messages_take_one_by_one(msgs):
    one = type(msgs[0])
    assert wire_size_many(msgs, one) == sum(len(wire_bytes(m)) for m in msgs)


def test_a_mixed_batch_adds_its_messages_up():
    msgs = [Plain(n=1), SAMPLES[1], Plain(n=2)]
    assert wire_size_many(msgs, None) == sum(wire_size(m) for m in msgs)
