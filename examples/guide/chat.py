"""The tutorial's application: a chat service (docs/guide/tutorial.md builds it step by step).

Rooms are User Spots, users are Actors that live in a lobby (an Entry Spot) and Join a room,
a moderation Channel vets nicknames, and an Instance Spot counts posts. Run it with
``python -m examples.guide.chat``; it prints what happened.
"""

from __future__ import annotations

import zlink


# [start:messages]
class EnterRoom(zlink.Message, type_name="chat.enter_room"):
    """To a user: join ``room`` under the nickname ``nick``."""

    room: str
    nick: str


class JoinRoom(zlink.Message, type_name="chat.join_room"):
    """What the room's ``on_actor_join`` receives with a Join."""

    nick: str


class Welcome(zlink.Message, type_name="chat.welcome"):
    """The room's reply to an accepted Join; the user gets it in ``on_join_completed``."""

    nick: str
    members: int


class Say(zlink.Request[bool], type_name="chat.say"):
    """To a user: say ``text`` in your room. The reply: whether you are in one."""

    text: str


class LeaveRoom(zlink.Message, type_name="chat.leave_room"):
    """To a user: leave your room (back to the lobby)."""


class Post(zlink.Message, type_name="chat.post"):
    """To a room: a line a member said."""

    nick: str
    text: str


class Line(zlink.Message, type_name="chat.line"):
    """To a member: a line of the room's transcript."""

    text: str


class Transcript(zlink.Request[list[str]], type_name="chat.transcript"):
    """To a room: every line so far."""


class WhoAmI(zlink.Request[str], type_name="chat.whoami"):
    """To a user: where it is, or why its last Join failed."""


class Inbox(zlink.Request[list[str]], type_name="chat.inbox"):
    """To a user: the lines it heard."""


class CheckNick(zlink.Request[bool], type_name="chat.check_nick"):
    """To the moderation Channel: may this nickname join?"""

    nick: str


class Counted(zlink.Message, type_name="chat.counted"):
    """To the stats Instance Spot: one more post in ``room``."""

    room: str


class Counts(zlink.Request[dict[str, int]], type_name="chat.counts"):
    """To the stats Instance Spot: posts per room."""


# [end:messages]

# [start:app]
app = zlink.App("chat")
# [end:app]


# [start:room]
@app.user_spot("chat.room")  # SPOT_WIDE (the default): one gate for the room and its members
class Room(zlink.UserSpot):
    def __init__(self, context: zlink.SpotContext) -> None:
        super().__init__(context)
        self.nicks: dict[str, str] = {}  # member actor id -> nickname
        self.lines: list[str] = []

    @zlink.handler
    def post(self, msg: Post) -> None:
        self.say(f"{msg.nick}: {msg.text}")
        # the Instance Spot "stats" is activated by the first message that names its type
        count = self.context.outbound.send_to_spot("stats", Counted(room=self.context.spot_id))
        count.instance_spot("chat.stats")
        count.submit()

    @zlink.handler
    def transcript(self, req: Transcript) -> list[str]:
        return list(self.lines)

    def say(self, line: str) -> None:
        """Add a line and send it to every member (each into that Actor's own queue)."""
        self.lines.append(line)
        for actor_id in self.nicks:
            self.context.outbound.send_to_actor(actor_id, Line(text=line)).submit()

    # [end:room]
    # [start:membership]
    async def on_actor_join(
        self, actor_id: str, request: zlink.Message | None
    ) -> zlink.ActorJoinResult:
        nick = request.nick if isinstance(request, JoinRoom) else actor_id
        # Yield: the room's gate is free while the Channel answers, so other posts and joins
        # run meanwhile; this continues later, as a new turn at the back of the room's queue
        check = self.context.outbound.request("chat.moderation", CheckNick(nick=nick))
        allowed = await check.yield_()
        if not allowed:
            return zlink.ActorJoinResult(accept=False, reason=f"nickname {nick!r} is not allowed")
        if nick in self.nicks.values():  # checked after resuming: another turn may have taken it
            return zlink.ActorJoinResult(accept=False, reason=f"{nick!r} is here already")
        self.nicks[actor_id] = nick
        return zlink.ActorJoinResult(reply=Welcome(nick=nick, members=len(self.nicks)))

    def on_joined_actor(self, actor: zlink.Actor) -> None:
        self.say(f"* {self.nicks[actor.actor_id]} joined")

    def on_leave_actor(self, actor: zlink.Actor) -> None:
        self.say(f"* {self.nicks.pop(actor.actor_id)} left")

    # [end:membership]


# [start:users]
@app.entry_spot("chat.lobby", actor="chat.user")  # new "chat.user" Actors live here
class Lobby(zlink.EntrySpot):
    pass


@app.actor("chat.user")
class User(zlink.Actor):
    def __init__(self, context: zlink.ActorContext) -> None:
        super().__init__(context)
        self.nick = ""
        self.room: str | None = None
        self.news = "new"  # what happened last, for WhoAmI
        self.heard: list[str] = []

    # [start:join]
    @zlink.handler
    def enter(self, msg: EnterRoom) -> None:
        # Defer() only registers the Join: it runs after this handler ends normally
        self.context.join(msg.room, JoinRoom(nick=msg.nick)).defer()

    def on_join_completed(self, completion: zlink.ActorJoinCompletion) -> None:
        if completion.joined and isinstance(completion.reply, Welcome):
            self.room, self.nick = completion.spot_id, completion.reply.nick
            self.news = f"{completion.reply.members} there"
        else:  # refused, or no such room: the error says which
            self.news = f"Join failed: {completion.error}"

    # [end:join]
    @zlink.handler
    def say(self, req: Say) -> bool:
        if self.room is None:
            return False
        # one-way: a member shares its room's gate, so awaiting a request to the room from
        # here would wait on its own gate (InvalidOperation)
        self.context.outbound.send_to_spot(self.room, Post(nick=self.nick, text=req.text)).submit()
        return True

    @zlink.handler
    def leave_room(self, msg: LeaveRoom) -> None:
        self.context.leave()  # back to the lobby, once this handler is over
        self.news = f"left {self.room}"
        self.room = None

    @zlink.handler
    def line(self, msg: Line) -> None:
        self.heard.append(msg.text)

    @zlink.handler
    def whoami(self, req: WhoAmI) -> str:
        place = f"{self.nick} in {self.room}" if self.room else "in the lobby"
        return f"{place} ({self.news})"

    @zlink.handler
    def inbox(self, req: Inbox) -> list[str]:
        return list(self.heard)


# [end:users]


# [start:channel]
@app.channel("chat.moderation")  # stateless: each request is a turn of its own
class Moderation:
    BANNED = frozenset({"root", "admin"})

    def __init__(self, context: zlink.ChannelContext) -> None:
        self.context = context

    @zlink.handler
    def check(self, req: CheckNick) -> bool:
        return req.nick.lower() not in self.BANNED


# [end:channel]


# [start:stats]
@app.instance_spot("chat.stats")  # activated by its first message; holds no Actors
class Stats(zlink.InstanceSpot):
    def __init__(self, context: zlink.InstanceSpotContext) -> None:
        super().__init__(context)
        self.posts: dict[str, int] = {}

    @zlink.handler
    def counted(self, msg: Counted) -> None:
        self.posts[msg.room] = self.posts.get(msg.room, 0) + 1

    @zlink.handler
    def counts(self, req: Counts) -> dict[str, int]:
        return dict(self.posts)


# [end:stats]


# [start:main]
def main() -> None:
    with zlink.Node(app, zlink.NodeConfig(node_id="chat-1")) as node:
        client = node.client()
        client.spots.get_or_create("room-1", "chat.room").wait(5)
        for user_id, nick in (("u1", "alice"), ("u2", "bob"), ("u3", "root")):
            client.actors.create("chat.user", actor_id=user_id).wait(5)
            client.send_to_actor(user_id, EnterRoom(room="room-1", nick=nick)).submit()
            # the user's next message runs once its Join has completed
            print(f"{user_id}: {client.request_to_actor(user_id, WhoAmI()).wait(5)}")

        for user_id, text in (("u1", "hi bob"), ("u2", "hello alice"), ("u3", "let me in")):
            said = client.request_to_actor(user_id, Say(text=text)).wait(5)
            print(f"{user_id} said {text!r}: {said}")
        client.send_to_actor("u2", LeaveRoom()).submit()
        print(f"u2: {client.request_to_actor('u2', WhoAmI()).wait(5)}")

        print("transcript of room-1:")
        for line in client.request_to_spot("room-1", Transcript()).wait(5):
            print(f"  {line}")
        print(f"u1 heard {client.request_to_actor('u1', Inbox()).wait(5)}")
        print(f"posts per room: {client.request_to_spot('stats', Counts()).wait(5)}")


if __name__ == "__main__":
    main()
# [end:main]
