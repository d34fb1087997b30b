"""Which of zlink's modules run compiled, and the switch that keeps them pure Python.

Issue "Performance" allows a compiled hot path on conditions: one source of truth, the
pure-Python modules stay and behave the same, CI runs the suite both ways, and a build that
cannot compile falls back. ``setup.py`` compiles the modules of the turn's path with Cython
from these very ``.py`` files, on the free-threaded build only (on 3.11 the compiled modules
measured slower than the specializing interpreter: docs/benchmarks.md), and writes
``_compiled.json``: per interpreter (its extension suffix), each compiled module's name and
the SHA-256 of the source it was compiled from.

This module, imported before any other of the package, decides per module:

* ``ZLINK_PURE=1`` in the environment: every module is imported from its ``.py``;
* an extension whose ``.py`` changed since it was built (an editable checkout edited or
  checked out again), or that this interpreter's build did not record (a module since taken
  off ``COMPILED``, another interpreter's build), is stale: its ``.py`` is imported, with one
  warning on stderr naming the rebuild command, so an edit always takes effect;
* otherwise Python's own import system finds the extension first, when there is one built
  for this interpreter.

Only the standard library is used here: nothing of zlink is imported yet.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

# the turn's path: a send, its lane, the gate, the worker, the turn, the reply (setup.py reads
# this list from here)
COMPILED = (
    "zlink.executor.gate",
    "zlink.executor.lanes",
    "zlink.executor.pool",
    "zlink.executor.turn",
    "zlink.runtime.runtime",
    "zlink.runtime.jobs",
    "zlink.messaging.calls",
    "zlink.messaging.context",
    "zlink.messaging.message",
    "zlink.messaging.completion",
)
MANIFEST = "_compiled.json"
INTERPRETER = importlib.machinery.EXTENSION_SUFFIXES[0]  # ".cpython-313t-x86_64-linux-gnu.so"
PURE_ENV = "ZLINK_PURE"
_PACKAGE = Path(__file__).parent
_log = logging.getLogger("zlink")


def source_digest(path: Path) -> str:
    """The SHA-256 of a module's source, as the build records it."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_path(name: str, package: Path = _PACKAGE) -> Path:
    parts = name.split(".")[1:]  # "zlink.executor.gate" -> executor/gate.py
    return package.joinpath(*parts[:-1], parts[-1] + ".py")


def built_sources(package: Path = _PACKAGE) -> list[Path]:
    """The package's ``.py`` files with an extension for this interpreter beside them (any
    name Python's import system would load instead), found by one walk of the package's
    folders: this runs at every ``import zlink``, so no file is opened or stat'ed here."""
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    found: list[Path] = []
    for root, _dirs, files in os.walk(package):
        names = set(files)
        for name in files:
            suffix = next((s for s in suffixes if name.endswith(s)), None)
            if suffix is not None and name[: -len(suffix)] + ".py" in names:
                found.append(Path(root, name[: -len(suffix)] + ".py"))
    # (zlink/__init__ itself is imported before this runs: the build never compiles it)
    return sorted(set(found) - {package / "__init__.py"})


class _SourceFinder:
    """Imports the named modules from their ``.py`` even where an extension sits beside it
    (a meta path finder first on ``sys.meta_path``; every other name it leaves alone)."""

    def __init__(self, names: dict[str, Path]) -> None:
        self.names = names

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        source = self.names.get(fullname)
        if source is None:
            return None
        return importlib.util.spec_from_file_location(fullname, source)


def _manifest(package: Path, interpreter: str = INTERPRETER) -> dict[str, str]:
    """The build's record for this interpreter: module name -> digest of its source (each
    interpreter's build keeps its own, so one build never vouches for another's files)."""
    try:
        text = (package / MANIFEST).read_text()
    except OSError:
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        _log.warning("zlink: %s is not JSON; every module runs as pure Python", MANIFEST)
        return {}
    mine = data.get(interpreter) if isinstance(data, dict) else None
    if not isinstance(mine, dict):
        return {}
    return {str(k): str(v) for k, v in mine.items() if str(k).startswith("zlink.")}


def _module_name(source: Path, package: Path) -> str:
    parts = source.relative_to(package).with_suffix("").parts
    if parts[-1] == "__init__":  # a package's own module: its name is the package's
        parts = parts[:-1]
    return ".".join(("zlink", *parts))


def plan(
    package: Path = _PACKAGE, environ: Mapping[str, str] = os.environ
) -> tuple[dict[str, Path], list[str]]:
    """The modules to import from their ``.py`` though an extension for this interpreter sits
    beside it, and which of those are stale (see above). Every extension beside a ``.py`` of
    the package counts, listed in ``COMPILED`` or not: one left over from a build of a module
    since taken off the list, or whose record is missing, is stale too."""
    pure = environ.get(PURE_ENV, "") not in ("", "0")
    built = built_sources(package)
    if not built:
        return {}, []
    manifest = _manifest(package)
    from_source: dict[str, Path] = {}
    stale: list[str] = []
    for source in built:
        name = _module_name(source, package)
        if pure:
            from_source[name] = source
        elif name not in COMPILED or manifest.get(name) != source_digest(source):
            from_source[name] = source  # no record, or another source's, counts as stale
            stale.append(name)
    return from_source, sorted(stale)


def install() -> None:
    """Puts the finder in place when some module must be imported from source (see above)."""
    from_source, stale = plan()
    if stale:
        _log.warning(
            "zlink: %d compiled module(s) not built from their current source by this "
            "interpreter (%s); running them as pure Python. Rebuild with: "
            "pip install --no-build-isolation -e .",
            len(stale),
            ", ".join(sorted(stale)),
        )
    if from_source:
        sys.meta_path.insert(0, _SourceFinder(from_source))


def compiled_modules() -> list[str]:
    """The names of zlink's modules imported compiled in this process (empty: pure Python)."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return sorted(
        name
        for name, module in list(sys.modules.items())
        if name.startswith("zlink.") and str(getattr(module, "__file__", "")).endswith(suffixes)
    )
