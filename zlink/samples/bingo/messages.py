"""The messages of the Bingo sample."""

from __future__ import annotations

import zlink


class Card(zlink.Message, type_name="bingo.card"):
    """A 5x5 card; 0 is the free centre."""

    rows: list[list[int]]


class PlayerRecord(zlink.Message, type_name="bingo.player_record"):
    actor_id: str
    games: int
    wins: int


class GetPlayerRecord(zlink.Request[PlayerRecord], type_name="bingo.get_player_record"):
    actor_id: str


class RecordResult(zlink.Message, type_name="bingo.record_result"):
    actor_id: str
    won: bool


class EnterRoom(zlink.Message, type_name="bingo.enter_room"):
    """To a player: join this room (the Join is deferred to the end of the handler, §5)."""

    room_id: str


class JoinRequest(zlink.Message, type_name="bingo.join_request"):
    """What the room's on_actor_join receives."""

    room_id: str


class NumberDrawn(zlink.Message, type_name="bingo.number_drawn"):
    number: int
    drawn_at: float  # node clock, for the latency figures


class ClaimBingo(zlink.Message, type_name="bingo.claim"):
    actor_id: str
    marked: list[int]


class GameOver(zlink.Message, type_name="bingo.game_over"):
    room_id: str
    winner: str


class StartGame(zlink.Message, type_name="bingo.start_game"):
    draw_interval: float


class RoomState(zlink.Request["RoomSummary"], type_name="bingo.room_state"):
    pass


class RoomSummary(zlink.Message, type_name="bingo.room_summary"):
    room_id: str
    players: int
    drawn: int
    winner: str | None
    finished: bool


RoomState.model_rebuild()
