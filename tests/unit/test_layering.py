"""The arrows of the package point one way.

Every ``zlink/**/*.py`` is read with ``ast`` (no module is imported). Every import counts: at
module level, inside functions and under ``if TYPE_CHECKING:`` alike, since a type-only import
is a dependency too. Relative imports are resolved to absolute module names; ``from P import n``
names the submodule ``P.n`` when ``P/n.py`` or ``P/n/`` exists, else the module ``P``.

Each module belongs to a unit, ``zlink.<first component>`` (``zlink.runtime.routing`` is in
``zlink.runtime``, ``zlink/__init__.py`` is the unit ``zlink``). A unit may import only the
units ``ALLOWED`` lists for it; the table has no cycle, and neither do the actual imports.
"""

from __future__ import annotations

import ast
import itertools
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "zlink"  # the package directory

HUB = "zlink"  # the package root: it re-exports the public surface (see the cycle checks)

# unit -> the units it may import (imports within one unit are always allowed).
ALLOWED: dict[str, frozenset[str]] = {
    # the error types: the bottom of the house, importing nothing of zlink
    "zlink.errors": frozenset(),
    # value types shared by every layer
    "zlink.types": frozenset({"zlink.errors"}),
    # duration parsing and arithmetic
    "zlink.durations": frozenset({"zlink.errors"}),
    # which modules run compiled: a leaf of the standard library, imported first by the package
    "zlink._native": frozenset(),
    # the lock ranks: a leaf, so any layer may name a rank
    "zlink.lock_order": frozenset(),
    # the kernel imports nothing of zlink
    "zlink.executor": frozenset(),
    # timers run on the kernel's clock and infrastructure thread
    "zlink.timers": frozenset({"zlink.errors", "zlink.durations", "zlink.executor"}),
    # messages, calls and contexts: what handlers see
    "zlink.messaging": frozenset(
        {"zlink.errors", "zlink.types", "zlink.durations", "zlink.executor", "zlink.timers"}
    ),
    # the @handler and @subscription declarations
    "zlink.handlers": frozenset({"zlink.errors", "zlink.messaging"}),
    # the state adapters used by relocation
    "zlink.adapters": frozenset({"zlink.errors", "zlink.messaging"}),
    # the base classes applications subclass
    "zlink.bases": frozenset({"zlink.types", "zlink.messaging"}),
    # network addresses: checked text, no sockets
    "zlink.addresses": frozenset({"zlink.errors"}),
    # the node configuration
    "zlink.config": frozenset({"zlink.errors", "zlink.executor", "zlink.addresses"}),
    # the status snapshots a node reports
    "zlink.status": frozenset({"zlink.errors", "zlink.types"}),
    # the mesh: transport, wire, membership, location, store
    "zlink.mesh": frozenset(
        {
            "zlink.addresses",
            "zlink.errors",
            "zlink.types",
            "zlink.durations",
            "zlink.executor",
            "zlink.lock_order",
            "zlink.messaging",
            "zlink.timers",
        }
    ),
    # the application declaration (types, handlers, relocation settings)
    "zlink.app": frozenset(
        {
            "zlink.errors",
            "zlink.types",
            "zlink.messaging",
            "zlink.handlers",
            "zlink.adapters",
            "zlink.bases",
            "zlink.timers",
        }
    ),
    # the runtime: acts, jobs, routing, directory, creation, closing
    "zlink.runtime": frozenset(
        {
            "zlink.errors",
            "zlink.types",
            "zlink.durations",
            "zlink.executor",
            "zlink.lock_order",
            "zlink.messaging",
            "zlink.timers",
            "zlink.handlers",
            "zlink.app",
            "zlink.status",
            "zlink.mesh",
            "zlink.bases",
        }
    ),
    # relocation: moves acts between nodes, above the runtime
    "zlink.relocation": frozenset(
        {
            "zlink.errors",
            "zlink.types",
            "zlink.executor",
            "zlink.lock_order",
            "zlink.messaging",
            "zlink.timers",
            "zlink.runtime",
            "zlink.mesh",
            "zlink.app",
        }
    ),
    # the node composes everything above
    "zlink.node": frozenset(
        {
            "zlink.errors",
            "zlink.types",
            "zlink.durations",
            "zlink.executor",
            "zlink.lock_order",
            "zlink.messaging",
            "zlink.timers",
            "zlink.handlers",
            "zlink.adapters",
            "zlink.bases",
            "zlink.config",
            "zlink.addresses",
            "zlink.status",
            "zlink.mesh",
            "zlink.app",
            "zlink.runtime",
            "zlink.relocation",
        }
    ),
    # test helpers (manual clock, local cluster) for applications' tests
    "zlink.testing": frozenset(
        {
            "zlink.app",
            "zlink.config",
            "zlink.mesh",
            "zlink.node",
            "zlink.errors",
            "zlink.executor",
        }
    ),
    # the admin HTTP server over a node's status
    "zlink.admin": frozenset({"zlink.errors", "zlink.node", "zlink.status"}),
    # a sample is an application: only the public package and zlink.testing
    "zlink.samples": frozenset({"zlink", "zlink.testing"}),
    # the command line: runs applications (and the samples), serves admin
    "zlink.cli": frozenset(
        {
            "zlink",
            "zlink.errors",
            "zlink.admin",
            "zlink.app",
            "zlink.config",
            "zlink.durations",  # --drain-timeout is checked as every duration is (§9)
            "zlink.node",
            "zlink.status",
            "zlink.samples",
            "zlink.mesh",  # zlink mesh reads the Location Store (downward: no cycle)
            "zlink._native",  # zlink version names the compiled modules
        }
    ),
    # the package __init__: every unit except the ones above it (cli, admin, testing, samples
    # and the ``python -m zlink`` entry point)
    "zlink": frozenset(
        {
            "zlink._native",
            "zlink.errors",
            "zlink.types",
            "zlink.durations",
            "zlink.lock_order",
            "zlink.executor",
            "zlink.timers",
            "zlink.messaging",
            "zlink.handlers",
            "zlink.adapters",
            "zlink.bases",
            "zlink.config",
            "zlink.status",
            "zlink.mesh",
            "zlink.app",
            "zlink.runtime",
            "zlink.relocation",
            "zlink.node",
        }
    ),
    # ``python -m zlink``: the command line
    "zlink.__main__": frozenset({"zlink.cli"}),
}


@dataclass(frozen=True)
class Import:
    path: Path  # the importing file
    line: int
    module: str  # the importing module, e.g. ``zlink.runtime.routing``
    target: str  # the imported module, absolute, e.g. ``zlink.executor``
    name: str | None  # for ``from target import name`` when ``name`` is not a submodule
    level: int  # 0 for an absolute import

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT.parent)}:{self.line}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _unit(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _is_zlink(module: str) -> bool:
    return module == "zlink" or module.startswith("zlink.")


def _is_submodule(package: str, name: str) -> bool:
    if not _is_zlink(package):
        return False  # only zlink's own layout is known here
    path = ROOT.parent.joinpath(*package.split("."), name)
    return path.with_suffix(".py").is_file() or path.is_dir()


def _files() -> list[Path]:
    return sorted(ROOT.rglob("*.py"))


def _imports_of(path: Path) -> list[Import]:
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append(Import(path, node.lineno, module, alias.name, None, 0))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                if node.level - 1 >= len(parts):
                    raise AssertionError(f"{path}:{node.lineno}: relative import beyond zlink")
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            for alias in node.names:
                if alias.name != "*" and _is_submodule(source, alias.name):
                    target, name = f"{source}.{alias.name}", None
                else:
                    target, name = source, alias.name
                found.append(Import(path, node.lineno, module, target, name, node.level))
    return sorted(found, key=lambda imp: imp.line)  # ast.walk goes breadth first


def _all_imports() -> list[Import]:
    return [imp for path in _files() for imp in _imports_of(path)]


def _zlink_edges() -> list[tuple[str, str, Import]]:
    """(importing unit, imported unit, import) for every import of another zlink unit."""
    edges = []
    for imp in _all_imports():
        if _is_zlink(imp.target):
            src, dst = _unit(imp.module), _unit(imp.target)
            if src != dst:
                edges.append((src, dst, imp))
    return edges


def _find_cycle(graph: dict[str, set[str]] | dict[str, frozenset[str]]) -> list[str] | None:
    """A cycle of ``graph`` (``[a, b, ..., a]``), or None. Self loops and edges into the hub
    are ignored: the package root only re-exports the public surface, and importing it (as
    ``zlink.cli`` and ``zlink.samples`` do) is using that surface, not reaching back down into
    the layers, so ``zlink -> zlink.node -> ... `` plus ``zlink.cli -> zlink`` is no cycle."""
    done: set[str] = set()
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(unit: str) -> list[str] | None:
        stack.append(unit)
        on_stack.add(unit)
        for nxt in sorted(graph.get(unit, ())):
            if nxt in (unit, HUB):
                continue
            if nxt in on_stack:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in done:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        on_stack.discard(unit)
        done.add(unit)
        return None

    for unit in sorted(graph):
        if unit not in done:
            cycle = visit(unit)
            if cycle:
                return cycle
    return None


def test_every_import_follows_an_allowed_arrow() -> None:
    bad: list[str] = []
    units = sorted({_unit(_module_name(path)) for path in _files()})
    bad += [
        f"new unit {unit}: add it to the layering table" for unit in units if unit not in ALLOWED
    ]
    for src, dst, imp in _zlink_edges():
        if src not in ALLOWED:
            continue  # reported above
        if dst not in ALLOWED:
            bad.append(
                f"{imp.where} imports {imp.target}: new unit {dst}: add it to the layering table"
            )
        elif dst not in ALLOWED[src]:
            bad.append(f"{imp.where} imports {imp.target} (needs the arrow {src} -> {dst})")
    assert not bad, "imports against the layering:\n" + "\n".join(dict.fromkeys(bad))


def test_the_allowed_arrows_have_no_cycle() -> None:
    unknown = sorted({dst for dsts in ALLOWED.values() for dst in dsts} - set(ALLOWED))
    assert not unknown, f"the table allows arrows into units it does not declare: {unknown}"
    cycle = _find_cycle(ALLOWED)
    assert cycle is None, "the allowed arrows have a cycle: " + " -> ".join(cycle)


def test_no_package_cycle_in_the_actual_imports() -> None:
    graph: dict[str, set[str]] = {}
    for src, dst, _imp in _zlink_edges():
        graph.setdefault(src, set()).add(dst)
    cycle = _find_cycle(graph)
    if cycle is not None:
        first = {(src, dst): imp.where for src, dst, imp in reversed(_zlink_edges())}
        steps = [f"{a} -> {b} ({first.get((a, b), '?')})" for a, b in itertools.pairwise(cycle)]
        pytest.fail("import cycle between units:\n" + "\n".join(steps))


def test_the_executor_is_used_only_through_its_facade() -> None:
    bad = [
        f"{imp.where} imports {imp.target} (import it from zlink.executor)"
        for imp in _all_imports()
        if imp.target.startswith("zlink.executor.") and _unit(imp.module) != "zlink.executor"
    ]
    assert not bad, "the executor's submodules used from outside it:\n" + "\n".join(
        dict.fromkeys(bad)
    )


def test_no_private_name_is_imported_across_modules() -> None:
    bad = [
        f"{imp.where} imports {imp.name} from {imp.target}"
        for imp in _all_imports()
        if imp.name is not None
        and imp.name.startswith("_")
        and not (imp.name.startswith("__") and imp.name.endswith("__"))  # __version__ is public
        and _is_zlink(imp.target)
        and imp.target != imp.module
    ]
    assert not bad, "private names imported from another module:\n" + "\n".join(bad)


def test_cli_does_not_import_examples() -> None:
    """No zlink module (the command line included) imports the top-level ``examples``."""
    bad = [
        f"{imp.where} imports {imp.target}"
        for imp in _all_imports()
        if imp.level == 0 and (imp.target == "examples" or imp.target.startswith("examples."))
    ]
    assert not bad, "zlink imports the examples:\n" + "\n".join(dict.fromkeys(bad))
