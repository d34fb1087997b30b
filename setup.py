"""zlink's build: pyproject.toml says everything but the compiled modules.

On the free-threaded CPython (3.13t) the modules of the turn's path are compiled with Cython
from their own ``.py`` files (pure-Python mode: one source of truth, no ``.pyx``). Measured in
docs/benchmarks.md: on 3.13t they cut a one-way message's CPU by about a fifth; on 3.11 the
same compiled modules were slower than the specializing interpreter, so there they are not
built. ``ZLINK_COMPILE=1`` builds them on any interpreter, ``ZLINK_COMPILE=0`` never.

A build that cannot compile (no Cython, no C compiler, a module Cython refuses) warns and
installs pure Python: every compiled module has its ``.py`` beside it, and ``zlink/_native.py``
imports the ``.py`` whenever the extension is missing, stale or ``ZLINK_PURE=1`` is set.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, ExecError, LinkError, PlatformError

# what a C build that cannot go on raises: no compiler, a failed compile or link
_BUILD_FAILED = (CCompilerError, CompileError, ExecError, LinkError, PlatformError, OSError)


def _native() -> Any:
    """zlink/_native.py (standard library only), loaded without importing the package: it
    names the compiled modules and digests their sources as it will check them at import."""
    spec = importlib.util.spec_from_file_location("_zlink_native", Path("zlink/_native.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NATIVE = _native()


def _warn(text: str) -> None:
    print(f"WARNING: zlink: {text}; installing pure Python", file=sys.stderr)


def _wanted() -> bool:
    choice = os.environ.get("ZLINK_COMPILE", "")
    if choice in ("0", "1"):
        return choice == "1"
    return bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


# each module's source digest as Cython is given it (before it translates: an edit after this
# makes the record older than the extension, so the extension is judged stale, never fresh)
DIGESTS: dict[str, str] = {}


def _extensions() -> list[Any]:
    if not _wanted():
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        _warn("Cython is not installed, so nothing is compiled")
        return []
    for name in NATIVE.COMPILED:
        DIGESTS[name] = NATIVE.source_digest(NATIVE.source_path(name, Path("zlink")))
    try:
        return list(
            cythonize(
                [str(NATIVE.source_path(name, Path("zlink"))) for name in NATIVE.COMPILED],
                force=True,  # never judged by file times: a checkout or a copy can reorder them
                compiler_directives={
                    "language_level": 3,
                    "freethreading_compatible": True,
                    # the hints are for mypy: pydantic's metaclass is not a plain `type`
                    "annotation_typing": False,
                },
                quiet=True,
            )
        )
    except Exception as exc:  # noqa: BLE001 - Cython's errors share no base; any one falls back
        _warn(f"Cython could not translate the modules ({exc})")
        return []


class _BuildExt(build_ext):
    """Builds what it can; a module that does not compile stays pure Python (with a warning),
    and the manifest names only the modules that built."""

    def run(self) -> None:
        self._built: list[str] = []
        self.force = True  # (as cythonize: file times decide nothing)
        try:
            super().run()
        except _BUILD_FAILED as exc:  # (a copy into the tree may have failed halfway)
            _warn(f"the compiled modules did not build ({exc})")
            self.extensions = []  # nothing for an editable or wheel build to copy
            self._built = []  # none vouched for: the tree's extensions go, all pure Python
        self._write_manifest()

    def build_extensions(self) -> None:
        wanted = list(self.extensions)
        # one C compiler per CPU (each module is one large .c file: ~75 s one after another
        # on 2 CPUs, the longest step of a fresh install and of CI's free-threaded runs)
        with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
            list(pool.map(self.build_extension, wanted))
        # what did not build is not an output: the editable and wheel builds copy the rest
        self.extensions = [ext for ext in wanted if ext.name in self._built]

    def build_extension(self, ext: Any) -> None:
        try:
            super().build_extension(ext)
        except _BUILD_FAILED as exc:
            _warn(f"{ext.name} did not compile ({exc})")
            return
        self._built.append(ext.name)

    def _write_manifest(self) -> None:
        digests = {name: DIGESTS[name] for name in self._built}
        if self.inplace:
            _forget_in_tree(set(self._built))  # what did not build this time: pure Python
            _record(Path("zlink", NATIVE.MANIFEST), digests)
        _record(Path(self.build_lib, "zlink", NATIVE.MANIFEST), digests)


def _record(target: Path, digests: dict[str, str] | None) -> None:
    """This interpreter's entry in the manifest at ``target`` (``None``: remove it); the
    entries of other interpreters' builds are kept."""
    try:
        data = json.loads(target.read_text())
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    # only other interpreters' entries stay (a build before the manifest was keyed wrote flat
    # "module": digest pairs, which an older tree would read as vouching for these files)
    data = {k: v for k, v in data.items() if k.startswith(".") and isinstance(v, dict)}
    data.pop(NATIVE.INTERPRETER, None)
    if digests is not None:
        data[NATIVE.INTERPRETER] = digests
    if not data and not target.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def _forget_in_tree(keep: set[str]) -> None:
    """Remove this interpreter's extensions of the listed modules from the source tree (but
    ``keep``'s): a build that compiles nothing, or fewer, leaves none of an older build
    behind to be imported."""
    for name in NATIVE.COMPILED:
        if name in keep:
            continue
        stem = NATIVE.source_path(name, Path("zlink")).with_suffix("")
        Path(f"{stem}{NATIVE.INTERPRETER}").unlink(missing_ok=True)


EXTENSIONS = _extensions()
if not EXTENSIONS:  # (ZLINK_COMPILE=0, no Cython): an older build's extensions go too
    _forget_in_tree(set())
    _record(Path("zlink", NATIVE.MANIFEST), None)

setup(ext_modules=EXTENSIONS, cmdclass={"build_ext": _BuildExt})
