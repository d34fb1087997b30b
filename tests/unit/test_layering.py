"""The arrows of the house point one way (docs/architecture.md; issue "The runtime, composed").

Every import of every module under ``zlink/`` is read with ``ast`` (nothing is imported):
module level, inside functions and under ``if TYPE_CHECKING:`` alike, since a type-only
import is a dependency too. Each module belongs to a unit (``zlink.<first part>``); a unit may
import only the units the table below allows, the table has no cycle, and neither do the
actual imports. Code above the kernel reaches ``zlink.executor`` only through its facade, and
no module imports another module's private name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "zlink"

_LEAVES = {"zlink.errors", "zlink.types", "zlink.durations", "zlink.lock_order"}
_BELOW_RUNTIME = {
    "zlink.errors", "zlink.types", "zlink.durations", "zlink.lock_order", "zlink.executor",
    "zlink.timers", "zlink.messaging", "zlink.handlers", "zlink.adapters", "zlink.bases",
    "zlink.config", "zlink.status", "zlink.mesh", "zlink.app",
}  # fmt: skip

# unit -> the units it may import. ``zlink`` (the package root) only re-exports the public
# surface; importing it is importing that surface, which only applications (samples, cli) do.
ALLOWED: dict[str, set[str]] = {
    "zlink.errors": set(),
    "zlink.types": {"zlink.errors"},
    "zlink.durations": {"zlink.errors"},
    "zlink.lock_order": set(),
    "zlink.executor": set(),  # the kernel imports nothing of zlink
    "zlink.timers": {"zlink.errors", "zlink.durations", "zlink.executor"},
    "zlink.messaging": {
        "zlink.errors",
        "zlink.types",
        "zlink.durations",
        "zlink.executor",
        "zlink.timers",
    },
    "zlink.handlers": {"zlink.errors", "zlink.messaging"},
    "zlink.adapters": {"zlink.errors", "zlink.messaging"},
    "zlink.bases": {"zlink.types", "zlink.messaging"},
    "zlink.config": {"zlink.errors", "zlink.executor"},
    "zlink.status": {"zlink.errors", "zlink.types"},
    "zlink.mesh": {
        "zlink.errors",
        "zlink.types",
        "zlink.durations",
        "zlink.executor",
        "zlink.lock_order",
        "zlink.messaging",
        "zlink.timers",
    },
    "zlink.app": {
        "zlink.errors",
        "zlink.types",
        "zlink.messaging",
        "zlink.handlers",
        "zlink.adapters",
        "zlink.bases",
        "zlink.timers",
    },
    "zlink.runtime": _BELOW_RUNTIME - {"zlink.config"},
    "zlink.relocation": _BELOW_RUNTIME | {"zlink.runtime"},
    "zlink.node": _BELOW_RUNTIME | {"zlink.runtime", "zlink.relocation"},
    "zlink.testing": {
        "zlink.app",
        "zlink.config",
        "zlink.mesh",
        "zlink.node",
        "zlink.errors",
        "zlink.executor",
    },
    "zlink.admin": {"zlink.errors", "zlink.node", "zlink.status"},
    "zlink.samples": {"zlink", "zlink.testing"},  # an application: the public surface only
    "zlink.cli": {
        "zlink",
        "zlink.errors",
        "zlink.admin",
        "zlink.app",
        "zlink.config",
        "zlink.node",
        "zlink.status",
        "zlink.samples",
    },
    "zlink": (_BELOW_RUNTIME | {"zlink.runtime", "zlink.relocation", "zlink.node"}),
    "zlink.__main__": {"zlink.cli"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _unit(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def _exists(module: str) -> bool:
    path = ROOT.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _imports() -> Iterator[tuple[Path, int, str, list[str]]]:
    """(file, line, imported module, names) for every zlink import of every zlink module."""
    for path in sorted(ROOT.rglob("*.py")):
        module = _module_name(path)
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield path, node.lineno, alias.name, []
            elif isinstance(node, ast.ImportFrom):
                names = [a.name for a in node.names]
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if not node.module:  # ``from .. import x``: x may be a module
                    for name in names:
                        sub = f"{target}.{name}"
                        yield path, node.lineno, sub if _exists(sub) else target, [name]
                else:
                    yield path, node.lineno, target, names


def _edges() -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = {}
    for path, line, target, _names in _imports():
        if not target.startswith("zlink"):
            continue
        src, dst = _unit(_module_name(path)), _unit(target)
        if src != dst:
            found.setdefault((src, dst), []).append(f"{path.relative_to(ROOT.parent)}:{line}")
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt == "zlink":  # the re-export hub: importing it is using the public surface
                continue
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_every_import_follows_an_allowed_arrow() -> None:
    bad = []
    for (src, dst), where in sorted(_edges().items()):
        if src not in ALLOWED:
            bad.append(f"new unit {src}: add it to the layering table ({where[0]})")
        elif dst not in ALLOWED[src]:
            bad.append(f"{src} -> {dst} is not an arrow of the house: {', '.join(where)}")
    assert not bad, "\n".join(bad)


def test_the_allowed_arrows_have_no_cycle() -> None:
    assert _cycle(ALLOWED) is None


def test_no_package_cycle_in_the_actual_imports() -> None:
    graph: dict[str, set[str]] = {}
    for src, dst in _edges():
        graph.setdefault(src, set()).add(dst)
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph) or [])}"


def test_leaves_and_the_kernel_import_nothing_above_them() -> None:
    for unit in (*_LEAVES, "zlink.executor"):
        assert ALLOWED[unit] <= _LEAVES, unit


def test_the_executor_is_used_only_through_its_facade() -> None:
    bad = [
        f"{path.relative_to(ROOT.parent)}:{line} imports {target}"
        for path, line, target, _ in _imports()
        if target.startswith("zlink.executor.")
        and not _module_name(path).startswith("zlink.executor")
    ]
    assert not bad, "\n".join(bad)


def test_no_private_name_is_imported_across_modules() -> None:
    bad = [
        f"{path.relative_to(ROOT.parent)}:{line} imports {name} from {target}"
        for path, line, target, names in _imports()
        if target.startswith("zlink") and target != _module_name(path)
        for name in names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert not bad, "\n".join(bad)


def test_nothing_in_zlink_imports_the_examples() -> None:
    bad = [
        f"{path.relative_to(ROOT.parent)}:{line}"
        for path, line, target, _ in _imports()
        if target == "examples" or target.startswith("examples.")
    ]
    assert not bad, bad
