"""The benchmark still runs (its quick mode), whatever its numbers."""

from __future__ import annotations

import pytest

from bench import core


@pytest.mark.timeout(120)
def test_the_core_benchmark_runs_in_quick_mode(capsys):
    assert core.main(["--quick", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "one-way to one Spot" in out and "round trip" in out and "fan-out" in out


def test_the_core_benchmark_states_its_cpus_and_refuses_bad_ones(capsys):
    with pytest.raises(SystemExit):
        core.main(["--quick", "--cpus", "zero"])
    assert "--cpus" in capsys.readouterr().err
    assert core.cpu_set("0,1") == {0, 1}
    assert core.layout()  # the header's cpus= field: this process's CPUs


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
    assert "floor contract" in out and "floor api" in out and "floor batch" in out


@pytest.mark.timeout(120)
def test_the_backpressure_benchmark_runs_in_quick_mode(capsys):
    from bench import backpressure

    assert backpressure.main(["--quick"]) == 0  # exactly once, in order, nothing refused
    out = capsys.readouterr().out
    assert "one node: median senders/drain" in out and "two nodes: median" in out


@pytest.mark.timeout(120)
def test_the_mesh_benchmark_runs_in_quick_mode(capsys):
    from bench import mesh

    assert mesh.main(["--quick", "--zlink-only"]) == 0  # two node processes, every count checked
    out = capsys.readouterr().out
    assert "zlink one-way msg/s" in out and "rtt vs pyzmq echo" in out


@pytest.mark.timeout(120)
def test_the_client_benchmark_runs_in_quick_mode(capsys):
    from bench import client

    assert client.main(["--quick"]) == 0  # a node process and a client, exactly once
    out = capsys.readouterr().out
    assert "round trip p50" in out and "one-way submit" in out and "batch" in out


@pytest.mark.timeout(120)
def test_the_rehome_benchmark_runs_in_quick_mode(capsys):
    from bench import rehome

    assert rehome.main(["--quick"]) == 0  # kill -9 a node process; its Spot serves again
    out = capsys.readouterr().out
    assert "sqlite lease 1s: vs lease" in out


@pytest.mark.timeout(120)
def test_the_chains_benchmark_runs_in_quick_mode(capsys):
    from bench import chains

    assert chains.main(["--quick", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "ping-pong" in out and "ring of 100 Spots" in out
