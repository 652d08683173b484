"""compare sits above capture and below replay: it imports neither, and replay plugs in as a
pass over the finished result."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import opscope.compare
from opscope.compare import passes


def _imports(root: Path) -> dict[Path, list[str]]:
    out: dict[Path, list[str]] = {}
    for path in root.rglob("*.py"):
        names: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names.append(node.module or "")
        out[path] = names
    return out


@pytest.mark.parametrize("above_or_below", ["opscope.capture", "opscope.replay"])
def test_compare_imports_neither_capture_nor_replay(above_or_below):
    root = Path(opscope.compare.__file__).parent
    for path, names in _imports(root).items():
        assert not any(n == above_or_below or n.startswith(above_or_below + ".") for n in names), path


def test_result_passes_register_once_and_are_found_by_name(monkeypatch):
    monkeypatch.setattr(passes, "_FACTORIES", {})
    monkeypatch.setattr(passes, "PROVIDERS", {})
    seen = []

    @passes.register_result_pass("count")
    def count(n):
        return lambda result, inputs: seen.append((n, result, inputs.noise))

    with pytest.raises(ValueError, match="already registered"):
        passes.register_result_pass("count")(count)
    passes.result_pass("count", 3)("result", passes.CompareInputs("t", "r", "noise"))
    assert seen == [(3, "result", "noise")]
    with pytest.raises(ValueError, match="no result pass named 'replay'"):
        passes.result_pass("replay", 1)


def test_replay_registers_its_pass_on_import():
    from opscope.replay import culprits_pass

    assert passes._FACTORIES["replay"] is culprits_pass
