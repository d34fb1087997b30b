"""The compiled modules and the switch that keeps them pure (zlink/_native.py, setup.py).

Issue "Performance": a compiled hot path has one source of truth, the pure-Python modules stay
and behave the same (CI runs the suite both ways on the free-threaded build), and an edited
source always takes effect, compiled or not.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import zlink
from zlink import _native


def _package(tmp_path: Path, names: tuple[str, ...], *, built: bool = True) -> Path:
    """A package tree like zlink's: each module's source, and an (empty) extension file for
    this interpreter beside it when ``built``."""
    package = tmp_path / "zlink"
    for name in names:
        source = _native.source_path(name, package)
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(f"# {name}\n")
        if built:
            suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
            Path(f"{source.with_suffix('')}{suffix}").write_bytes(b"")
    return package


def _record(package: Path, names: tuple[str, ...], interpreter: str = _native.INTERPRETER) -> None:
    digests = {n: _native.source_digest(_native.source_path(n, package)) for n in names}
    (package / _native.MANIFEST).write_text(json.dumps({interpreter: digests}))


def test_an_extension_built_from_this_source_is_left_to_the_import_system(tmp_path: Path) -> None:
    package = _package(tmp_path, _native.COMPILED)
    _record(package, _native.COMPILED)
    assert _native.plan(package, {}) == ({}, [])


def test_zlink_pure_imports_every_module_from_its_source(tmp_path: Path) -> None:
    package = _package(tmp_path, _native.COMPILED)
    _record(package, _native.COMPILED)
    from_source, stale = _native.plan(package, {"ZLINK_PURE": "1"})
    assert from_source == {n: _native.source_path(n, package) for n in _native.COMPILED}
    assert stale == []
    assert _native.plan(package, {"ZLINK_PURE": "0"}) == ({}, [])


def test_an_edited_source_takes_effect_and_is_named_stale(tmp_path: Path) -> None:
    package = _package(tmp_path, _native.COMPILED)
    _record(package, _native.COMPILED)
    edited = _native.source_path("zlink.executor.gate", package)
    edited.write_text(edited.read_text() + "x = 1\n")
    assert _native.plan(package, {}) == ({"zlink.executor.gate": edited}, ["zlink.executor.gate"])


def test_an_extension_with_no_record_counts_as_stale(tmp_path: Path) -> None:
    package = _package(tmp_path, ("zlink.executor.gate", "zlink.executor.pool"))
    _record(package, ("zlink.executor.pool",))
    assert _native.plan(package, {})[1] == ["zlink.executor.gate"]
    (package / _native.MANIFEST).write_text("not json")
    assert _native.plan(package, {})[1] == ["zlink.executor.gate", "zlink.executor.pool"]


def test_an_extension_of_a_module_off_the_list_is_stale(tmp_path: Path) -> None:
    """A review's finding: a module taken off ``COMPILED`` kept its extension in the tree, and
    that extension won over the edited ``.py`` (and over ``ZLINK_PURE=1``)."""
    package = _package(tmp_path, ("zlink.executor.gate", "zlink.executor.infra"))
    _record(package, ("zlink.executor.gate", "zlink.executor.infra"))
    infra = _native.source_path("zlink.executor.infra", package)
    assert _native.plan(package, {}) == ({"zlink.executor.infra": infra}, ["zlink.executor.infra"])
    assert "zlink.executor.infra" in _native.plan(package, {"ZLINK_PURE": "1"})[0]


def test_an_extension_of_a_package_init_is_judged_too(tmp_path: Path) -> None:
    """A second review's finding: ``executor/__init__.<ext>`` (a hand-run ``cythonize -i``)
    was never judged and won over the ``.py``, even under ``ZLINK_PURE=1``."""
    package = _package(tmp_path, ("zlink.executor.__init__",))
    init = package / "executor" / "__init__.py"
    assert _native.plan(package, {}) == ({"zlink.executor": init}, ["zlink.executor"])
    spec = _native._SourceFinder({"zlink.executor": init}).find_spec("zlink.executor")
    assert spec is not None and spec.submodule_search_locations == [str(init.parent)]


def test_another_interpreters_build_vouches_for_nothing_here(tmp_path: Path) -> None:
    """A review's finding: one manifest for every interpreter let a 3.11 build record today's
    source over 3.13t extensions built from yesterday's."""
    package = _package(tmp_path, ("zlink.executor.gate",))
    _record(package, ("zlink.executor.gate",), interpreter=".cpython-399-elsewhere.so")
    assert _native.plan(package, {})[1] == ["zlink.executor.gate"]


def test_nothing_built_means_nothing_to_decide(tmp_path: Path) -> None:
    package = _package(tmp_path, _native.COMPILED, built=False)
    assert _native.plan(package, {"ZLINK_PURE": "1"}) == ({}, [])


def test_the_source_finder_imports_the_py_file(tmp_path: Path) -> None:
    source = tmp_path / "somewhere.py"
    source.write_text("VALUE = 42\n")
    finder = _native._SourceFinder({"zlink_native_probe": source})
    spec = finder.find_spec("zlink_native_probe")
    assert spec is not None and spec.origin == str(source)
    assert finder.find_spec("zlink.executor.gate") is None  # any other name: left alone


def test_what_runs_compiled_here_is_what_the_build_recorded() -> None:
    """In the pure run every module is Python; otherwise every module the build recorded
    whose source is unchanged runs compiled (none, where nothing was built)."""
    compiled = _native.compiled_modules()
    if os.environ.get("ZLINK_PURE", "") not in ("", "0"):
        assert compiled == []
        return
    package = Path(zlink.__file__).parent
    from_source, _stale = _native.plan(package, {})
    expected = sorted(
        name
        for name in _native.COMPILED
        if _native.source_path(name, package) in _native.built_sources(package)
        and name not in from_source
    )
    assert [n for n in compiled if n in _native.COMPILED] == expected


def test_zlink_pure_in_a_child_process_runs_no_module_compiled() -> None:
    code = "import zlink, zlink.node; from zlink import _native; print(_native.compiled_modules())"
    env = {**os.environ, "ZLINK_PURE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", _native.COMPILED)
def test_every_compiled_module_has_its_source(name: str) -> None:
    assert _native.source_path(name).is_file()


@pytest.mark.parametrize("name", _native.COMPILED)
def test_a_compiled_module_keeps_to_what_behaves_the_same_compiled(name: str) -> None:
    """No ``nonlocal`` (Cython keeps a closure's variables in a plain C struct, unsafe to write
    from one thread while another reads it without the GIL), no frames, no source of its own
    functions (CONTRIBUTING.md, "The compiled modules")."""
    import ast

    tree = ast.parse(_native.source_path(name).read_text())
    found = [
        f"line {node.lineno}: {ast.dump(node)[:60]}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Nonlocal)
        or (isinstance(node, ast.Attribute) and node.attr in ("_getframe", "getsource", "f_back"))
    ]
    assert found == []
