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
    tree = ast.parse("def f():\n    from linattn.packing import run_packed\n")
    edges, _, _ = _imports("linattn.api", tree)
    assert _cycles({"linattn.api": edges, "linattn.packing": {"linattn.api"}}) == [["linattn.api", "linattn.packing"]]
