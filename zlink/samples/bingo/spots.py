"""Spots, Actors and the Channel of the Bingo sample."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable

import zlink

from .messages import (
    Card,
    ClaimBingo,
    EnterRoom,
    GameOver,
    GetPlayerRecord,
    JoinRequest,
    NumberDrawn,
    PlayerRecord,
    RecordResult,
    RoomState,
    RoomSummary,
    StartGame,
)

app = zlink.App("bingo")

MAX_PLAYERS = 100
Observer = Callable[[str, float], None]  # (event, latency seconds)
_observers: list[Observer] = []


def observe(observer: Observer) -> None:
    """Receive ("mark", latency) and ("win", 0.0) events (the driver's figures)."""
    _observers.append(observer)


def _emit(event: str, value: float) -> None:
    for observer in _observers:
        observer(event, value)


def make_card(seed: str) -> list[list[int]]:
    """A classic 75-ball card: column c holds numbers 15c+1..15c+15; the centre is free (0)."""
    rnd = random.Random(seed)
    columns = [rnd.sample(range(15 * c + 1, 15 * c + 16), 5) for c in range(5)]
    rows = [[columns[c][r] for c in range(5)] for r in range(5)]
    rows[2][2] = 0
    return rows


def has_line(rows: list[list[int]], marked: set[int]) -> bool:
    """Whether a row, a column or a diagonal is fully marked (the centre always is)."""
    hit = [[n == 0 or n in marked for n in row] for row in rows]
    lines = [*hit, *([hit[r][c] for r in range(5)] for c in range(5))]
    lines.append([hit[i][i] for i in range(5)])
    lines.append([hit[i][4 - i] for i in range(5)])
    return any(all(line) for line in lines)


class PlayerAdapter:
    """A player's card and marks as JSON: what a room move carries for each member."""

    def capture(self, player: Player) -> bytes:
        return json.dumps(
            {"card": player.card, "marked": sorted(player.marked), "claimed": player.claimed,
             "room": player.room}
        ).encode()  # fmt: skip

    def restore(self, player: Player, data: bytes) -> None:
        state = json.loads(data)
        player.card, player.marked = state["card"], set(state["marked"])
        player.claimed, player.room = state["claimed"], state["room"]
        player.joined.set()


# SPOT_WIDE: the room, its players and its timer share one gate; a room moves between nodes
# with its players, their queues and its draw timer (JsonStateAdapter: its fields are JSON)
@app.user_spot("bingo.room", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter))
class Room(zlink.UserSpot):
    def __init__(self, context: zlink.SpotContext) -> None:
        super().__init__(context)
        self.players: dict[str, list[list[int]]] = {}
        self.pending_joins: dict[str, str] = {}
        self.bag = list(range(1, 76))
        random.Random(context.spot_id).shuffle(self.bag)
        self.drawn: list[int] = []
        self.winner: str | None = None

    def can_accept_player(self) -> bool:
        return self.winner is None and not self.drawn and len(self.players) < MAX_PLAYERS

    async def on_actor_join(self, actor_id: str, request: object) -> zlink.ActorJoinResult:
        room_id = request.room_id if isinstance(request, JoinRequest) else ""
        self.pending_joins[actor_id] = room_id
        try:  # the room's gate is released while the record is fetched (guide §5)
            record: PlayerRecord = await self.context.outbound.request(
                "bingo.api", GetPlayerRecord(actor_id=actor_id)
            ).yield_()
        except Exception:
            self.pending_joins.pop(actor_id, None)
            raise
        resumed = self.pending_joins.pop(actor_id, None)  # state may have changed meanwhile
        if resumed != self.context.spot_id or not self.can_accept_player():
            return zlink.ActorJoinResult(accept=False, reason="the game has started or is full")
        card = make_card(f"{self.context.spot_id}/{actor_id}/{record.games}")
        self.players[actor_id] = card
        return zlink.ActorJoinResult(reply=Card(rows=card))

    @zlink.handler
    def start(self, msg: StartGame) -> None:
        if not self.drawn and self.winner is None:
            self.context.timers.register("draw", msg.draw_interval)

    @zlink.timer_handler("draw")
    def on_draw(self, tick: zlink.TimerTick) -> None:
        if self.winner is not None or not self.bag:
            self.context.timers.cancel("draw")
            return
        number = self.bag.pop()
        self.drawn.append(number)
        for actor_id in self.players:
            drawn = NumberDrawn(number=number, drawn_at=tick.fired_at)
            self.context.outbound.send_to_actor(actor_id, drawn).submit()

    @zlink.handler
    def claim(self, msg: ClaimBingo) -> None:
        card = self.players.get(msg.actor_id)
        if self.winner is not None or card is None:
            return
        if not set(msg.marked) <= set(self.drawn) or not has_line(card, set(msg.marked)):
            return  # a false claim is ignored
        self.winner = msg.actor_id
        self.context.timers.cancel("draw")
        _emit("win", 0.0)
        over = GameOver(room_id=self.context.spot_id, winner=msg.actor_id)
        for actor_id in self.players:
            self.context.outbound.send_to_actor(actor_id, over).submit()
            won = actor_id == msg.actor_id
            self.context.outbound.send(
                "bingo.api", RecordResult(actor_id=actor_id, won=won)
            ).submit()

    @zlink.handler
    def state(self, req: RoomState) -> RoomSummary:
        return RoomSummary(
            room_id=self.context.spot_id,
            players=len(self.players),
            drawn=len(self.drawn),
            winner=self.winner,
            finished=self.winner is not None or not self.bag,
        )


@app.entry_spot("bingo.lobby", actor="bingo.player")
class Lobby(zlink.EntrySpot):
    pass


@app.actor("bingo.player", relocation=zlink.Relocation.preserve_state(PlayerAdapter))
class Player(zlink.Actor):
    def __init__(self, context: zlink.ActorContext) -> None:
        super().__init__(context)
        self.card: list[list[int]] | None = None
        self.marked: set[int] = set()
        self.claimed = False
        self.room: str | None = None
        self.joined = threading.Event()
        self.join_error: zlink.ZLinkError | None = None

    @zlink.handler
    def enter(self, msg: EnterRoom) -> None:
        self.context.join(msg.room_id, JoinRequest(room_id=msg.room_id)).defer()

    def on_join_completed(self, completion: zlink.ActorJoinCompletion) -> None:
        if completion.joined and isinstance(completion.reply, Card):
            self.card = completion.reply.rows
            self.room = completion.spot_id
        else:
            self.join_error = completion.error
        self.joined.set()
        _emit("joined" if completion.joined else "refused", 0.0)

    @zlink.handler
    def number(self, msg: NumberDrawn, context: zlink.MessageContext) -> None:
        if self.card is None or self.claimed:
            return
        _emit("mark", max(0.0, self._now() - msg.drawn_at))
        if any(msg.number in row for row in self.card):
            self.marked.add(msg.number)
            if has_line(self.card, self.marked):
                self.claimed = True  # one-way: awaiting the room would wait on its own gate
                claim = ClaimBingo(actor_id=self.actor_id, marked=sorted(self.marked))
                assert self.room is not None
                self.context.outbound.send_to_spot(self.room, claim).submit()

    @zlink.handler
    def game_over(self, msg: GameOver) -> None:
        self.claimed = True

    def _now(self) -> float:
        return _clock_now()


_clock: list[Callable[[], float]] = []


def use_clock(now: Callable[[], float]) -> None:
    """The driver tells the sample which clock the node runs on (for latency figures)."""
    _clock[:] = [now]


def _clock_now() -> float:
    return _clock[0]() if _clock else 0.0


@app.channel("bingo.api")
class Api:
    """Player records: a stand-in for an external store (a dict behind a lock)."""

    _lock = threading.Lock()
    _records: dict[str, PlayerRecord] = {}

    def __init__(self, context: zlink.ChannelContext) -> None:
        self.context = context

    @zlink.handler
    def get_record(self, req: GetPlayerRecord) -> PlayerRecord:
        with self._lock:
            return self._records.get(req.actor_id) or PlayerRecord(
                actor_id=req.actor_id, games=0, wins=0
            )

    @zlink.handler
    def record(self, msg: RecordResult) -> None:
        with self._lock:
            old = self._records.get(msg.actor_id) or PlayerRecord(
                actor_id=msg.actor_id, games=0, wins=0
            )
            self._records[msg.actor_id] = PlayerRecord(
                actor_id=msg.actor_id, games=old.games + 1, wins=old.wins + int(msg.won)
            )


__all__ = ["EnterRoom", "RoomState", "StartGame", "app", "observe", "use_clock"]
