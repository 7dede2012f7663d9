"""The shape of ``linattn.tools``: packages over one harness, imports that point one way. Read from the source
(no import runs): no import circle among the tools' modules, lazy imports included; the harness imports no tool;
no tool imports another module's private name; nothing else in the package imports a tool."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
TOOLS = SRC / "linattn" / "tools"


def _name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, imported names) for every import statement, wherever it sits in the file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, [a.name for a in node.names]))
    return out


def _modules() -> dict[str, Path]:
    return {_name(p): p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts}


def _edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        if not name.startswith("linattn.tools"):
            continue
        deps = set()
        for module, names in _imports(path):
            for target in [f"{module}.{n}" for n in names if f"{module}.{n}" in mods] or [module]:
                if target.startswith("linattn.tools") and target != name:
                    deps.add(target)
        edges[name] = deps
    return edges


def test_no_import_circle_among_the_tools():
    edges = _edges(_modules())
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(edges.get(node, ())):
            assert state.get(dep) != 1, " -> ".join([*path, node, dep])
            if dep not in state:
                visit(dep, [*path, node])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [])


def test_the_harness_imports_no_tool():
    for name, deps in _edges(_modules()).items():
        if name.startswith("linattn.tools.harness"):
            assert all(d.startswith("linattn.tools.harness") for d in deps), (name, deps)


def test_no_tool_imports_a_private_name():
    for name, path in _modules().items():
        if not name.startswith("linattn.tools"):
            continue
        for module, names in _imports(path):
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            assert not (module.startswith("linattn") and private), (name, module, private)


def test_nothing_outside_the_tools_imports_them():
    for name, path in _modules().items():
        if name.startswith("linattn.tools") or name == "linattn.tools.cli":
            continue
        assert not any(m.startswith("linattn.tools") for m, _ in _imports(path)), name


def test_every_tool_is_a_package_or_a_single_module():
    loose = sorted(p.stem for p in TOOLS.glob("*.py") if p.stem != "__init__")
    # grouped in packages; the harness's results and cli live in harness/, not loose under tools/
    assert not [n for n in loose if n.startswith(("bench", "perf", "sp_", "mqar", "results", "cli_files"))], loose
    for package in ("harness", "bench", "perf", "sp", "mqar"):
        assert (TOOLS / package / "__init__.py").exists()
