"""The Bingo sample plays full games (guide-execution-model §3-§5)."""

from __future__ import annotations

import pytest

from zlink.samples.bingo.play import play
from zlink.samples.bingo.spots import has_line, make_card
from zlink.testing import ManualClock


def test_a_full_game_on_a_manual_clock_ends_with_a_winner_in_every_room():
    summary = play(rooms=3, players=5, draw_interval=1.0, workers=2, clock=ManualClock())
    assert summary.games == 3
    assert len(summary.winners) == 3
    assert summary.players == 15
    assert summary.counters.get("handler_errors", 0) == 0
    assert summary.marks > 0


def test_rooms_moved_between_three_nodes_mid_game_still_end_with_a_winner_each():
    summary = play(rooms=3, players=4, nodes=3, draw_interval=1.0, workers=2, clock=ManualClock())
    assert summary.games == 3 and len(summary.winners) == 3
    assert summary.moves >= 3  # every round one room moved, players and draw timer with it
    # each room move, plus each player that joined a room on another node (it moved there)
    assert summary.counters["relocated_in"] > summary.moves
    assert summary.counters.get("handler_errors", 0) == 0


def test_a_card_has_a_free_centre_and_a_line_wins():
    card = make_card("seed")
    assert card[2][2] == 0
    assert all(
        15 * c + 1 <= card[r][c] <= 15 * c + 15
        for r in range(5)
        for c in range(5)
        if (r, c) != (2, 2)
    )
    assert has_line(card, set(card[0]))
    assert has_line(card, {card[r][2] for r in range(5)})  # the centre column, free centre
    assert not has_line(card, set())


def test_more_players_than_a_room_seats_is_invalid_argument():
    import pytest

    import zlink
    from zlink.samples.bingo.spots import MAX_PLAYERS

    with pytest.raises(zlink.InvalidArgument, match="seats"):
        play(rooms=1, players=MAX_PLAYERS + 1, clock=ManualClock())


@pytest.mark.timeout(120)
def test_bingo_on_three_node_processes_driven_by_a_client_moves_rooms_while_they_play():
    """python-api §10: three node processes on 127.0.0.1, a driver that is only a
    ``zlink.connect`` client, rooms moved between the processes mid-game; every game ends
    with a winner and no handler failed."""
    from zlink.samples.bingo.processes import play_processes

    s = play_processes(rooms=6, players=6, nodes=3, draw_interval=0.05, move_interval=0.02)
    assert s.games == 6 and len(s.winners) == 6
    assert s.players == 36
    assert s.moves >= 1  # rooms moved while the games were on
    assert s.counters.get("handler_errors", 0) == 0
