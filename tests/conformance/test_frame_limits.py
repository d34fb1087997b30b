"""Frames between nodes whose ``max_frame_bytes`` differ (python-api §9: a message admitted
at the source is handled, or counted as dropped at both ends; here: refused at the source).

A service probe: node b took frames of at most 1 MiB, node a sent it 2 MiB. The send was
accepted at a and lost, counted only at b (``data_lost_in_transit``); a request of that size
waited out its whole timeout. Each node now tells its peers its limit in its greeting, and a
call too large for the peer it goes to is refused where it is made."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import zlink
from tests.conftest import WAIT

MiB = 1024 * 1024


class Blob(zlink.Message, type_name="t.fl.blob"):
    text: str


class Echo(zlink.Request[str], type_name="t.fl.echo"):
    text: str = ""
    reply_bytes: int = 0


class Count(zlink.Request[int], type_name="t.fl.count"):
    pass


app = zlink.App("frame-limits")


@app.user_spot("t.fl.box")
class Box(zlink.UserSpot):
    def __init__(self, context: zlink.SpotContext) -> None:
        super().__init__(context)
        self.count = 0

    @zlink.handler
    def blob(self, msg: Blob) -> None:
        self.count += 1

    @zlink.handler
    def echo(self, req: Echo) -> str:
        self.count += 1
        return "x" * req.reply_bytes

    @zlink.handler
    def get(self, req: Count) -> int:
        return self.count


def _node(node_id: str, store: str, **extra: object) -> zlink.Node:
    config = zlink.NodeConfig(
        node_id=node_id, listen="tcp://127.0.0.1:0", store=store, workers=1, **extra
    )
    return zlink.Node(app, config).start()


@pytest.mark.timeout(60)
def test_a_call_larger_than_its_peer_takes_is_refused_where_it_is_made(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'mesh.db'}"
    with _node("a", store) as a, _node("b", store, max_frame_bytes=MiB) as b:
        end = time.monotonic() + WAIT
        while a.peers() != ["b"] or b.peers() != ["a"]:  # (bounded) they meet, and greet
            assert time.monotonic() < end, "the nodes never met"
            time.sleep(0.01)  # a handshake on other threads: nothing to wait on but its effect
        b.client().spots.get_or_create("far", "t.fl.box").wait(WAIT)
        ca = a.client()
        assert ca.request_to_spot("far", Count()).wait(WAIT) == 0  # a routes "far" to b
        big = "x" * (2 * MiB)
        started = time.monotonic()
        with pytest.raises(zlink.InvalidArgument, match="frame"):
            ca.send_to_spot("far", Blob(text=big)).wait(WAIT)
        with pytest.raises(zlink.InvalidArgument, match="frame"):
            ca.request_to_spot("far", Echo(text=big)).wait(WAIT)
        # a reply larger than its caller takes: a handler on a answers b with 2 MiB
        a.client().spots.get_or_create("near", "t.fl.box").wait(WAIT)
        with pytest.raises(zlink.HandlerError, match="frame"):
            b.client().request_to_spot("near", Echo(reply_bytes=2 * MiB)).wait(WAIT)
        assert time.monotonic() - started < WAIT  # at once, not at a deadline
        assert ca.request_to_spot("far", Count()).wait(WAIT) == 0  # nothing too large ran
        assert "data_lost_in_transit" not in b.counters()


@pytest.mark.timeout(60)
def test_a_reply_larger_than_a_frame_may_be_is_a_handler_error_for_a_client_too(
    tmp_path: Path,
) -> None:
    """A probe: a reply of 67,108,874 characters reached a ``zlink.connect`` client, while a
    request of that size from it was refused (the node's frame limit). A reply past the
    limit the node told its clients is a ``HandlerError`` for a client too, as between
    nodes; nothing of it is sent."""
    store = f"sqlite:///{tmp_path / 'mesh.db'}"
    with _node("a", store, max_frame_bytes=MiB) as a:
        a.client().spots.get_or_create("near", "t.fl.box").wait(WAIT)
        assert a.address is not None
        with zlink.connect(a.address, timeout=WAIT) as client:
            with pytest.raises(zlink.HandlerError, match="frame"):
                client.request_to_spot("near", Echo(reply_bytes=2 * MiB)).wait(WAIT)
            assert client.request_to_spot("near", Count()).wait(WAIT) == 1  # it ran; still served
