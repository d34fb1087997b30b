"""The call builders' static types hold: mypy finds no error in ``typing_check_calls.py``.

An option returns ``Self`` (a chain keeps the exact call class), a request's call is
``RequestCall[T]`` for a ``Request[T]`` message, a create's is ``CreateCall`` of its result
(python-api §4, §6). Errors mypy would report inside ``zlink`` itself are ``mypy``'s own run's
business (CI), so imported modules are followed silently here.
"""

from __future__ import annotations

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHECKED = pathlib.Path(__file__).with_name("typing_check_calls.py")


def test_call_builders_type_check(tmp_path: pathlib.Path) -> None:
    api = pytest.importorskip("mypy.api")
    out, err, status = api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--follow-imports=silent",
            "--cache-dir",
            str(tmp_path / "mypy_cache"),
            "--no-error-summary",
            "--show-error-codes",
            str(CHECKED),
        ]
    )
    assert status == 0 and not out.strip(), f"mypy found errors:\n{out}{err}"
