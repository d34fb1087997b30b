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


# -- lane_size: what a local lane reserves without serializing (issue "Performance") -------------
import random  # noqa: E402

from pydantic import ConfigDict, Field, field_serializer  # noqa: E402

from zlink.messaging.message import lane_size, lane_size_many  # noqa: E402


class Flat(zlink.Message, type_name="t.ws.flat"):
    flag: bool = False
    n: int = 0
    x: float = 0.0
    name: str = ""
    maybe_n: int | None = None
    maybe_name: str | None = None
    maybe_x: float | None = None


class Numbers(zlink.Message, type_name="t.ws.numbers"):
    a: int = 0
    b: float = 0.0
    c: bool = True


class Aliased(zlink.Message, type_name="t.ws.aliased"):
    model_config = ConfigDict(frozen=True, populate_by_name=True)
    long_field_name_for_the_wire: int = Field(0, serialization_alias="a_much_longer_name_on_wire")


class Custom(zlink.Message, type_name="t.ws.custom"):
    n: int = 0

    @field_serializer("n")
    def _n(self, n: int) -> str:
        return "n" * n


class Extra(zlink.Message, type_name="t.ws.extra"):
    model_config = ConfigDict(frozen=True, extra="allow")
    n: int = 0


def _strings(rng: random.Random) -> list[str]:
    ascii_hard = '"\\\n\t\x00\x01\x1f\x7f/ '
    return [
        "",
        "plain",
        "\x00" * 300,  # the longest escape, six bytes a character (sized exactly)
        'quo"te back\\slash ' * 300,  # printable: counted, not serialized
        "".join(chr(rng.randrange(32, 127)) for _ in range(5000)),
        ascii_hard * 20,
        "".join(rng.choice(ascii_hard) for _ in range(300)),
        "".join(chr(rng.randrange(0, 128)) for _ in range(1000)),
        "x" * 100_000,
        "한국어 🎲",  # not ASCII: sized exactly
    ]


def _floats(rng: random.Random) -> list[float]:
    return [0.0, -0.0, 0.1, 1e300, -1.7976931348623157e308, 5e-324, -2.2250738585072014e-308,
            float("inf"), float("-inf"), float("nan"),
            *(rng.uniform(-1, 1) * 10 ** rng.randrange(-320, 308) for _ in range(200)),
            *(-rng.random() * 10.0 ** -rng.randrange(300, 308) for _ in range(50))]  # fmt: skip


def _ints(rng: random.Random) -> list[int]:
    return [0, -1, 2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 10**400, -(10**400),
            *(rng.randrange(-(2**70), 2**70) for _ in range(200))]  # fmt: skip


def test_a_lane_reserves_at_least_the_wire_form_of_every_flat_message():
    """§7: the byte limit holds; the reservation is never below the bytes of the wire form."""
    rng = random.Random(7)
    msgs: list[zlink.Message] = []
    for s in _strings(rng):
        msgs += [Flat(name=s), Flat(maybe_name=s), Flat(name=s, maybe_name=s)]
    for x in _floats(rng):
        msgs += [Flat(x=x), Flat(maybe_x=x), Numbers(b=x)]
    for n in _ints(rng):
        msgs += [Flat(n=n), Flat(maybe_n=n), Numbers(a=n)]
    msgs += [Flat(flag=True, n=-(2**63), x=-1.7976931348623157e308, maybe_n=-(2**63),
                  maybe_x=-2.2250738585072014e-308, name="", maybe_name=""), Numbers(c=False),
             Aliased(), Aliased(long_field_name_for_the_wire=-(2**63))]  # fmt: skip
    for m in msgs:
        assert lane_size(m) >= len(wire_bytes(m)), m


def test_a_flat_messages_bound_is_close_to_its_wire_form_and_its_strs_are_exact():
    """An honest account, not a blanket one: only numbers are taken at their longest."""
    m = Numbers(a=1, b=0.5)
    assert len(wire_bytes(m)) <= lane_size(m) <= len(wire_bytes(m)) + 19 + 21 + 1  # 1, 0.5, true
    for text in ("", "abc", 'say "hi" \\ bye', "x" * 100_000):

        class Text(zlink.Message, type_name=f"t.ws.text.{len(text)}"):
            text: str

        assert lane_size(Text(text=text)) == len(wire_bytes(Text(text=text)))


@pytest.mark.parametrize(
    "msg",
    [
        Custom(n=50),
        Extra(n=1, more="x" * 100),
        Rich(text="t", values=[1.0]),
        Flat(name="tab\there"),
        Flat(name="ünïcode"),
        Flat(n=10**30),
    ],
    ids=["serializer", "extra-allowed", "nested", "control-char", "non-ascii", "big-int"],
)
def test_what_has_no_cheap_bound_is_sized_exactly(msg):
    assert lane_size(msg) == len(wire_bytes(msg))


def test_a_lone_surrogate_is_still_refused_when_sized_for_a_lane():
    with pytest.raises(zlink.InvalidArgument):
        lane_size(Flat(name="\ud800"))
    with pytest.raises(zlink.InvalidArgument):
        lane_size(Flat(maybe_name="ok \udfff"))


def test_a_batch_of_a_bounded_class_reserves_its_bound_per_message():
    class Fixed(zlink.Message, type_name="t.ws.fixed"):
        b: float = 0.0
        c: bool | None = None

    fixed = [Fixed(b=i / 3) for i in range(100)]
    assert lane_size_many(fixed, Fixed) == 100 * lane_size(Fixed())
    assert lane_size_many(fixed, Fixed) >= sum(len(wire_bytes(m)) for m in fixed)
    msgs = [Numbers(a=i, b=i / 3) for i in range(100)] + [Numbers(a=10**30)]
    assert lane_size_many(msgs, Numbers) == sum(map(lane_size, msgs))
    assert lane_size_many(msgs, Numbers) >= sum(len(wire_bytes(m)) for m in msgs)
