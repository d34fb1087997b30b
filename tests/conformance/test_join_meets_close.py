"""A Join that its room's close overtakes (python-api §3, §5; kotlin-spot-interface
lifecycle: a closing Spot sends its members home before ``on_closing``).

Found by a growth probe: an Actor whose Join a room accepted while that room was closing
became a member after the close had sent its members home. It was told it had joined a room
that was gone, and stayed bound to it for good: every ``disconnect()`` and ``leave()`` was
refused as "moving", and it kept the closed room alive (13 to 106 per 1,000 join/close
pairs). A room that is no longer ready when its answer comes now fails the Join, and the Actor
stays where it was.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT


class Enter(zlink.Message, type_name="t.jc.enter"):
    room: str


class Where(zlink.Request[str], type_name="t.jc.where"):
    pass


class Quit(zlink.Message, type_name="t.jc.quit"):
    pass


ASKED, ANSWER = threading.Event(), threading.Event()
DONE: list[zlink.ActorJoinCompletion] = []
COMPLETED = threading.Event()
QUIT = threading.Event()


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    for event in (ASKED, ANSWER, COMPLETED, QUIT):
        event.clear()
    DONE.clear()
    yield
    ANSWER.set()


def build_app() -> zlink.App:
    app = zlink.App("join-meets-close")

    @app.entry_spot("t.jc.lobby", actor="t.jc.player")
    class Lobby(zlink.EntrySpot):
        def on_disconnect_actor(self, actor: zlink.Actor) -> None:
            QUIT.set()

    @app.user_spot("t.jc.room")
    class Room(zlink.UserSpot):
        def on_actor_join(self, actor_id: str, request: Any) -> zlink.ActorJoinResult:
            ASKED.set()
            assert ANSWER.wait(WAIT)  # the test closes the room meanwhile
            return zlink.ActorJoinResult()

    @app.actor("t.jc.player")
    class Player(zlink.Actor):
        @zlink.handler
        def enter(self, msg: Enter) -> None:
            self.context.join(msg.room).defer()

        @zlink.handler
        def where(self, req: Where) -> str:
            return self.context.spot_id

        @zlink.handler
        def quit(self, msg: Quit) -> None:
            self.context.disconnect()

        def on_join_completed(self, done: zlink.ActorJoinCompletion) -> None:
            DONE.append(done)
            COMPLETED.set()

    return app


def test_a_join_its_room_accepts_as_the_room_closes_fails_and_the_actor_stays(make_node):
    node = make_node(build_app())
    client = node.client()
    ref = client.spots.get_or_create("room", "t.jc.room").wait(WAIT).spot_ref
    pid = client.actors.create("t.jc.player").wait(WAIT).actor_id
    client.send_to_actor(pid, Enter(room="room")).submit()
    assert ASKED.wait(WAIT)  # on_actor_join runs on the room: it will accept
    assert client.spots.close(ref)  # the close begins: the room has no member to send home
    ANSWER.set()
    assert COMPLETED.wait(WAIT)
    (done,) = DONE
    assert not done.joined and isinstance(done.error, zlink.Unavailable), done
    node.wait_idle(WAIT)
    assert "room" not in node._runtime.spots  # the room closed
    assert client.request_to_actor(pid, Where()).wait(WAIT) == "t.jc.lobby@node-1"
    client.send_to_actor(pid, Quit()).submit()  # and it can end, as any Actor can
    assert QUIT.wait(WAIT)
    node.wait_idle(WAIT)
    assert pid not in node._runtime.actors
    assert not node.counters().get("handler_errors")
