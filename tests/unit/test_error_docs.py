"""Every public error class says, in its docstring, when it is raised and what to do, as
docs/guide/errors.md does for each (issue 15 review): ``help(zlink.Unavailable)`` answers
the question a user has when one is raised."""

from __future__ import annotations

import inspect
import pathlib

import pytest

import zlink
from zlink import errors

ROOT = pathlib.Path(__file__).resolve().parents[2]
PUBLIC = sorted(
    (name for name, obj in vars(errors).items()
     if inspect.isclass(obj) and issubclass(obj, zlink.ZLinkError)),
    key=lambda name: name,
)  # fmt: skip


def test_the_public_errors_are_the_ones_zlink_exports() -> None:
    assert len(PUBLIC) == 10
    assert all(getattr(zlink, name) is getattr(errors, name) for name in PUBLIC)


@pytest.mark.parametrize("name", PUBLIC)
def test_each_error_says_when_it_is_raised_and_what_to_do(name: str) -> None:
    doc = inspect.getdoc(getattr(errors, name)) or ""
    when, sep, todo = doc.partition("What to do:")
    assert sep, f"{name}'s docstring has no 'What to do:'"
    assert len(when.split()) >= 8 and len(todo.split()) >= 4, doc
    assert f"\n### {name}\n" in (ROOT / "docs" / "guide" / "errors.md").read_text()
