"""The package's layers (docs/architecture.md): imports run one way and form no circle.

Every ``import`` statement counts: module level, inside functions, and under
``TYPE_CHECKING`` (a type-only circle is still two modules that cannot be understood apart).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import opscope
from opscope.config import PHASE_CODES, PHASES

ROOT = Path(opscope.__file__).parent

# Lower number = lower layer; a module may import its own layer or lower ones.
LAYERS = {
    "_version": 0, "errors": 0, "model": 0, "config": 0, "_callable": 0,
    "storage": 1,
    "capture": 2, "demo": 2,
    "compare": 3, "watch": 3, "profile": 3, "monitor": 3, "check_ranks": 3,
    "replay": 4,
    "report": 5,
    "": 6, "tensorflow": 6,  # the public API (opscope/__init__.py, opscope.tensorflow) wires the layers
    "integrations": 6,  # training frameworks' callbacks driving the public API's sessions
    "cli": 7, "autostart": 7, "autostart_tensorflow": 7, "__main__": 7,
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = ["opscope", *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _targets(module: str, path: Path) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(_resolve(a.name) for a in node.names if a.name.startswith("opscope"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            if base.startswith("opscope"):  # `from pkg import submodule` imports the submodule
                found.update(_resolve(f"{base}.{a.name}") if f"{base}.{a.name}" in MODULES else _resolve(base)
                             for a in node.names)
    return {t for t in found if t and t != module}


GRAPH = {m: _targets(m, p) for m, p in MODULES.items()}


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    return LAYERS[top]


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative enough here)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    return out


def test_every_top_level_module_has_a_layer():
    assert {m.split(".")[1] if "." in m else "" for m in MODULES} <= set(LAYERS)


def test_no_import_circle():
    assert _cycles() == []


def test_no_import_runs_up_a_layer():
    upward = sorted(f"{m} -> {t}" for m, ts in GRAPH.items() for t in ts if _layer(t) > _layer(m))
    assert upward == []


def test_compare_imports_nothing_from_capture_and_capture_no_renderer():
    assert not [m for m, ts in GRAPH.items() if m.startswith("opscope.compare") and any(
        t.startswith("opscope.capture") for t in ts)]
    assert not [m for m, ts in GRAPH.items()
                if m.startswith(("opscope.capture", "opscope.profile", "opscope.watch", "opscope.monitor"))
                and any(t.startswith("opscope.report") for t in ts)]


def test_the_native_observers_number_phases_as_config_does():
    header = (ROOT / "capture" / "torch" / "native" / "_c" / "observer.h").read_text(encoding="utf-8")
    enum = re.search(r"enum Phase : int8_t \{([^}]*)\}", header)
    assert enum is not None
    codes = {name.strip().lower(): int(code) for name, code in re.findall(r"(\w+)\s*=\s*(\d+)", enum.group(1))}
    assert codes == PHASE_CODES and tuple(codes) == PHASES


def _reads_environment(node: ast.AST) -> bool:
    """``os.environ.get(...)``, ``os.getenv(...)`` or ``os.environ[...]`` read (not a copy of the whole)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        text = ast.unparse(node.func)
        return text in ("os.environ.get", "os.getenv", "environ.get", "getenv")
    return isinstance(node,
                      ast.Subscript) and isinstance(node.ctx, ast.Load) and ast.unparse(node.value) == "os.environ"


def test_environment_variables_are_read_only_in_config_env():
    readers = sorted(f"{m}:{n.lineno}" for m, p in MODULES.items() if not m.startswith("opscope.config")
                     for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))) if _reads_environment(n))
    assert readers == []
