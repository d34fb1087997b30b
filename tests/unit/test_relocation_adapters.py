"""Relocation adapters: the contract, JsonStateAdapter, and validation at Node.start()."""

from __future__ import annotations

import pytest

import zlink


class Room:
    def __init__(self) -> None:
        self.context = object()
        self.players = ["a", "b"]
        self.round = 3
        self._cache = {"x": 1}


def test_json_state_adapter_round_trips_public_state_into_a_fresh_instance():
    adapter = zlink.JsonStateAdapter()
    source = Room()
    source.players.append("c")
    data = adapter.capture(source)
    target = Room()
    target.players, target.round = [], 0
    adapter.restore(target, bytearray(data))  # a defensive copy of any bytes-like payload
    assert (target.players, target.round) == (["a", "b", "c"], 3)
    assert target._cache == {"x": 1} and target.context is not source.context
    assert isinstance(adapter, zlink.RelocationAdapter)


def test_empty_bytes_are_a_valid_state_and_bad_state_is_state_incompatible():
    adapter = zlink.JsonStateAdapter()
    room = Room()
    adapter.restore(room, b"")
    assert room.round == 3
    room.round = object()  # type: ignore[assignment]
    with pytest.raises(zlink.StateIncompatible):
        adapter.capture(room)
    with pytest.raises(zlink.StateIncompatible):
        adapter.restore(Room(), b"{not json")


def test_the_adapter_type_is_validated_when_the_node_starts():
    class NotAnAdapter:
        pass

    app = zlink.App("reloc")

    @app.user_spot("t.rl.room", relocation=zlink.Relocation.preserve_state(NotAnAdapter))
    class Bad(zlink.UserSpot):
        pass

    node = zlink.Node(app, zlink.NodeConfig(workers=1))
    with pytest.raises(zlink.InvalidOperation, match="lacks"):
        node.start()
    node.shutdown()

    good = zlink.App("reloc-ok")

    @good.user_spot("t.rl.ok", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter))
    class Good(zlink.UserSpot):
        pass

    with zlink.Node(good, zlink.NodeConfig(workers=1)):
        pass
