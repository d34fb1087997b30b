"""``zlink run`` whose standard output goes away: a service's output is read by whatever its
operator piped it into (``zlink run app | head -1``, a log shipper that restarts), and a
reader that left never stops the service (README "Running ZLink as a service")."""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.timeout(60)
def test_a_node_whose_stdout_reader_left_serves_and_stops_cleanly() -> None:
    """Its reader reads the first line and goes (as ``| head -1``): what the node says next
    meets a broken pipe. Before, the next line raised ``BrokenPipeError`` out of ``zlink
    run``: the node stopped at once with a traceback, or its stop ended in one and exit 1."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "zlink", "run", "examples.counter:app", "--admin", "127.0.0.1:0"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("admin on http://127.0.0.1:"), line
        address = line.split()[2].removeprefix("http://")
        proc.stdout.close()  # the reader leaves: every later line meets a broken pipe
        status = subprocess.run(
            [sys.executable, "-m", "zlink", "status", "--admin", address],
            cwd=ROOT, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert status.returncode == 0, f"the node stopped with its reader: {status.stderr}"
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "Traceback" not in err and "BrokenPipe" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
