"""The benchmark still runs (its quick mode), whatever its numbers."""

from __future__ import annotations

import pytest

from bench import core


@pytest.mark.timeout(120)
def test_the_core_benchmark_runs_in_quick_mode(capsys):
    assert core.main(["--quick", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "one-way to one Spot" in out and "round trip" in out and "fan-out" in out


@pytest.mark.timeout(120)
def test_the_peers_benchmark_runs_in_quick_mode(capsys):
    from bench import peers

    assert peers.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "asyncio" in out and "interpreter limit" in out and "speedup" in out


@pytest.mark.timeout(120)
def test_the_split_benchmark_runs_in_quick_mode(capsys):
    from bench import split

    assert split.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "zlink one-way" in out and "zlink batch" in out
