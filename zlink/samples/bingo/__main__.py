"""``python -m zlink.samples.bingo``: play a few games and print the summary."""

from .play import play

if __name__ == "__main__":
    s = play(rooms=4, players=8)
    print(f"{s.games} games, winners: {s.winners}")
    print(f"{s.marks} marks, p50 {s.p50_ms:.2f} ms, p99 {s.p99_ms:.2f} ms, {s.seconds:.2f} s")
