"""The layout rules of the package, checked over its own import graph (read from the source with
``ast``, nothing imported):

- no import circle between modules, and none between the parts of the house (a top-level module,
  or a subpackage such as ``shardkit/stream/`` taken as one part), so every import runs down;
- no private name (one leading underscore) imported from another module, C extension modules
  aside (``_jpegroi``, ``_kernels``);
- no module of shardkit named like a public function of the package (``shardkit.pack`` and
  ``shardkit.verify`` stay the functions after any import).

Every import counts, including those inside functions and under ``TYPE_CHECKING``: a late import
hides a circle from Python, not from a reader.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "shardkit"
C_EXTENSIONS = {"shardkit.decode._jpegroi", "shardkit.augment._kernels"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str) -> list[tuple[str, str | None, int]]:
    """``(imported module, name taken from it or None, line)`` for every import of ``module``
    that lands inside shardkit; ``from pkg import mod`` counts as an import of ``pkg.mod``."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "shardkit":
                    out.append((alias.name, None, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(node, module, path.name == "__init__.py")
            if source.split(".")[0] != "shardkit":
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if sub in MODULES or sub in C_EXTENSIONS:
                    out.append((sub, None, node.lineno))
                else:
                    out.append((source, alias.name, node.lineno))
    return out


def _part(module: str) -> str:
    """The part of the house a module belongs to: ``shardkit.stream`` for
    ``shardkit.stream.loader``, the module itself at the top level."""
    parts = module.split(".")
    return ".".join(parts[:2])


def _edges() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module in MODULES:
        for target, _, _ in _imports(module):
            if target == "shardkit" or target in C_EXTENSIONS:
                continue  # the root only resolves public names lazily
            while target not in MODULES and "." in target:
                target = target.rsplit(".", 1)[0]
            if target != module:
                graph[module].add(target)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _why(graph: dict[str, set[str]], circle: list[str]) -> list[str]:
    members = set(circle)
    return [f"{a} -> {b}" for a in circle for b in sorted(graph[a]) if b in members]


def test_the_graph_sees_the_imports():
    """The reader is not vacuous: it finds imports the package is known to make."""
    graph = _edges()
    assert "shardkit.dataset.manifest" in graph["shardkit.stream.source"]
    assert "shardkit.packer.options" in graph["shardkit.packer.run"]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_between_modules():
    graph = _edges()
    circles = _circles(graph)
    assert not circles, "\n".join(" | ".join(_why(graph, c)) for c in circles)


def test_every_import_runs_down_between_parts():
    """A subpackage or top-level module is one part; parts import each other without a circle
    (so they stack in floors, and no import runs from a lower part up to a higher one)."""
    graph = _edges()
    parts: dict[str, set[str]] = {}
    for module, targets in graph.items():
        for target in targets:
            if _part(target) != _part(module):
                parts.setdefault(_part(module), set()).add(_part(target))
    circles = _circles(parts)
    detail = []
    for circle in circles:
        members = set(circle)
        detail += [f"{m} -> {t}" for m, ts in graph.items() for t in sorted(ts)
                   if _part(m) in members and _part(t) in members and _part(m) != _part(t)]
    assert not circles, "\n".join(detail)


def test_no_private_name_crosses_a_module():
    found = []
    for module in MODULES:
        for target, name, line in _imports(module):
            private_module = target.rsplit(".", 1)[-1].startswith("_") \
                and not target.rsplit(".", 1)[-1].startswith("__") and target not in C_EXTENSIONS
            private_name = name is not None and name.startswith("_") and not name.startswith("__")
            if (private_module and target != module) or (private_name and target != module):
                found.append(f"{MODULES[module].relative_to(PACKAGE.parent)}:{line}: "
                             f"{target}{'.' + name if name else ''}")
    assert not found, "\n".join(found)


def _private_attribute_uses(module: str) -> list[str]:
    """``alias._name`` where ``alias`` is another shardkit module bound by an import."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name in MODULES:
                    aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(node, module, path.name == "__init__.py")
            for a in node.names:
                if f"{source}.{a.name}" in MODULES:
                    aliases[a.asname or a.name] = f"{source}.{a.name}"
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and aliases[node.value.id] != module
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            out.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: "
                       f"{aliases[node.value.id]}.{node.attr}")
    return out


def test_no_private_attribute_of_another_module_is_used():
    found = [use for module in MODULES for use in _private_attribute_uses(module)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("name", ["pack", "verify"])
def test_public_functions_stay_functions_after_any_import(name):
    """Importing a submodule binds its name on the parent package; no submodule of shardkit
    carries the name of a public function, so ``shardkit.pack`` is the function before and
    after the packer is imported, and ``from shardkit import pack`` gives the function."""
    assert f"shardkit.{name}" not in MODULES
    script = (
        "import inspect, shardkit\n"
        f"first = shardkit.{name}\n"
        "import shardkit.packer.run, shardkit.packer.cli, shardkit.doctor.verify, shardkit.cli\n"
        f"from shardkit import {name} as second\n"
        f"third = shardkit.{name}\n"
        "assert inspect.isfunction(first), first\n"
        "assert first is second is third, (first, second, third)\n"
        "print(first.__module__)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == {"pack": "shardkit.packer.run",
                                   "verify": "shardkit.doctor.verify"}[name]
