"""The Bingo sample of the guide (guide-execution-model §3-§5), on ZLink for Python.

* ``bingo.lobby`` — the Entry Spot where ``bingo.player`` Actors are created.
* ``bingo.room`` — a SpotWide User Spot: it draws a number on a timer, holds its players as
  member Actors (one gate for all of them: no locks), checks claims and ends the game.
* ``bingo.api`` — a Channel serving player records; the room asks it with ``yield_()`` while a
  player joins, so other turns of the room go on meanwhile (guide §5).

``python -m zlink.samples.bingo`` or ``zlink bingo play --rooms 4 --players 8`` plays games.
"""

from .spots import app as app

__all__ = ["app"]
