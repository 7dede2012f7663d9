"""The package's shape, read from its source with ``ast``: no module reaches into another module's private
(``_name``) names, and the imports between linattn's modules form no circle (an import inside a function counts:
deferring an import hides a circle, it does not remove one)."""

from __future__ import annotations

import ast
from pathlib import Path

import linattn

SRC = Path(linattn.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = ["linattn", *path.relative_to(SRC).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    is_pkg = MODULES[module].name == "__init__.py"
    base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_pkg else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, tree: ast.AST):
    """(imported module, names bound to linattn modules) for every import statement anywhere in the file."""
    edges, aliases, private = set(), {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "linattn":
                    edges.add(a.name)
                    if a.asname:
                        aliases[a.asname] = a.name
                    else:
                        aliases[a.name.split(".")[0]] = "linattn"
        elif isinstance(node, ast.ImportFrom):
            src = _resolve(module, node)
            if src.split(".")[0] != "linattn":
                continue
            for a in node.names:
                full = f"{src}.{a.name}"
                if full in MODULES:
                    edges.add(full)
                    aliases[a.asname or a.name] = full
                else:
                    edges.add(src)
                    if a.name.startswith("_") and not a.name.startswith("__") and src != module:
                        private.append(f"{src}.{a.name}")
    return edges, aliases, private


def _private_uses(module: str, tree: ast.AST, aliases: dict[str, str]) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        chain, base = [], node.value
        while isinstance(base, ast.Attribute):
            chain.append(base.attr)
            base = base.value
        if isinstance(base, ast.Name) and base.id in aliases:
            target = ".".join([aliases[base.id], *reversed(chain)])
            if target in MODULES and target != module:
                found.append(f"{target}.{node.attr}")
    return found


def _scan():
    graph, private = {}, []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges, aliases, from_private = _imports(module, tree)
        graph[module] = {e for e in edges if e in MODULES and e != module}
        for name in from_private + _private_uses(module, tree, aliases):
            private.append((module, name))
    return graph, private


def test_no_module_uses_another_modules_private_names():
    _, private = _scan()
    bad = sorted(set(private))
    assert not bad, "private names used across modules:\n" + "\n".join(f"{m}: {n}" for m, n in bad)


def test_the_private_name_scan_sees_both_spellings():
    tree = ast.parse("from linattn.api import _x\nfrom linattn import api\napi._y\n")
    edges, aliases, private = _imports("linattn.packing", tree)
    assert private == ["linattn.api._x"]
    assert _private_uses("linattn.packing", tree, aliases) == ["linattn.api._y"]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    graph, _ = _scan()
    circles = _cycles(graph)
    assert not circles, f"import circles: {circles}"


def test_the_circle_scan_sees_an_import_inside_a_function():
    tree = ast.parse("def f():\n    from linattn.packing import compute_packed\n")
    edges, _, _ = _imports("linattn.api", tree)
    assert _cycles({"linattn.api": edges, "linattn.packing": {"linattn.api"}}) == [["linattn.api", "linattn.packing"]]


CPU_KERNELS = {f"linattn.kernels.cpu_{name}" for name in
               ("backward", "conv", "decode", "intrinsics", "loop", "prefill", "ssm", "threads")}


def test_cpu_kernel_files_load_through_the_one_loader():
    """The CPU kernel files import one another and `linattn.buffers`, nothing above them (no policy), and no module
    outside `linattn.kernels` imports them: `linattn.backends.cpu.kernel` loads them by name, after it has chosen
    numba's threading layer."""
    graph, _ = _scan()
    assert {m for m in MODULES if m.startswith("linattn.kernels.cpu_")} == CPU_KERNELS
    outside = sorted(f"{m} -> {t}" for m, targets in graph.items() if not m.startswith("linattn.kernels.")
                     for t in targets if t in CPU_KERNELS)
    assert not outside, "CPU kernel files imported outside the loader:\n" + "\n".join(outside)
    up = sorted(f"{m} -> {t}" for m in CPU_KERNELS for t in graph[m] if t not in CPU_KERNELS | {"linattn.buffers"})
    assert not up, "CPU kernel files importing above the kernels:\n" + "\n".join(up)


def _is_tool(module: str) -> bool:
    return module == "linattn.tools" or module.startswith("linattn.tools.")


def test_the_core_never_imports_the_tools():
    graph, _ = _scan()
    bad = sorted(f"{m} -> {t}" for m, targets in graph.items() if not _is_tool(m) for t in targets if _is_tool(t))
    assert not bad, "core modules importing the tools side:\n" + "\n".join(bad)


def test_the_core_scan_sees_a_tool_import():
    tree = ast.parse("def f():\n    from linattn.tools import memory\n")
    edges, _, _ = _imports("linattn.api", tree)
    assert any(_is_tool(e) for e in edges)


# The tools' third-party packages, refused by an import hook in a fresh interpreter: the core must not need them.
_TOOL_PACKAGES = ("click", "tqdm", "matplotlib", "jsonschema", "safetensors")
_BLOCKED_CORE = f"""
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {_TOOL_PACKAGES!r}:
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Refuse())
import torch, linattn, linattn.nn, linattn.distributed, linattn.reference, linattn.integrations.transformers
q = k = v = torch.ones(1, 5, 2, 3)
o, state = linattn.linear_attention(q, k, v, rule="gated", g=torch.full((1, 5, 2), -0.5), output_final_state=True)
o_t, _ = linattn.step(q[:, 0], k[:, 0], v[:, 0], state, rule="gated", g=torch.zeros(1, 2))
layer = linattn.nn.LinearAttention(8, num_heads=2, head_dim=4)
layer(torch.randn(1, 4, 8))
print("core ok", sorted(m for m in sys.modules if m.split(".")[0] in {_TOOL_PACKAGES!r}))
"""


def test_the_core_runs_without_the_tools_packages():
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _BLOCKED_CORE], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "PYTHONPATH": str(SRC.parent)})
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "core ok []"


def test_the_command_without_the_tools_extra_says_what_to_install():
    import subprocess
    import sys

    code = _BLOCKED_CORE.split("import torch")[0] + "import linattn.tools.cli\n"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "PYTHONPATH": str(SRC.parent)})
    assert run.returncode == 1
    assert "pip install 'linattn[tools]'" in run.stderr


def _record_comparisons(tree: ast.AST) -> list[int]:
    """Lines where a State's record (``x.rule``, ``x.feature_map``, ``x.normalized`` of a name other than self, ctx,
    call) is compared with anything but None."""
    fields, owners = {"rule", "feature_map", "normalized"}, {"self", "ctx", "call"}
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        record = any(isinstance(x, ast.Attribute) and x.attr in fields
                     and not (isinstance(x.value, ast.Name) and x.value.id in owners) for x in sides)
        against_none = any(isinstance(x, ast.Constant) and x.value is None for x in sides)
        if record and not against_none:
            lines.append(node.lineno)
    return lines


def test_the_state_record_is_checked_in_one_function():
    """Whether a state's record (rule, feature map, normalizer) agrees with a call is decided only by
    linattn.state.record_mismatch; every check of a state uses it and words its own error."""
    found = {}
    for name, path in MODULES.items():
        if name.startswith("linattn.tools"):
            continue
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                for line in _record_comparisons(fn):
                    found.setdefault(f"{name}.{fn.name}", set()).add(line)
    assert set(found) == {"linattn.state.record_mismatch"}, found


def test_the_record_scan_sees_a_comparison():
    tree = ast.parse("def f(state, rule):\n    if state.rule is not None and state.rule != rule:\n        pass\n")
    assert _record_comparisons(tree) == [2]
    assert _record_comparisons(ast.parse("def f(self, rule):\n    return self.rule != rule\n")) == []


def test_docstrings_speak_markdown():
    """The API reference renders docstrings as Markdown: a Sphinx role (:func:`x`) would show literally there."""
    import re

    role = re.compile(r":(?:py:)?(?:func|class|mod|meth|data|attr|exc|obj):`")
    hits = [f"{path.relative_to(SRC)}:{i}" for path in SRC.rglob("*.py")
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if role.search(line)]
    assert not hits, "Sphinx roles in the source:\n" + "\n".join(hits)
