"""Helpers the benchmarks that start processes share."""

from __future__ import annotations

import subprocess
from typing import Any


def stop(proc: subprocess.Popen[Any], timeout: float = 15.0) -> None:
    """Close its stdin (the benchmarks' processes stop when it closes), wait for it, kill it
    if it does not end in ``timeout``, and close its pipes."""
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    if proc.stdout is not None:
        proc.stdout.close()
