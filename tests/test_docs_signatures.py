"""docs/DESIGN.md's signatures are the code's: every ```python block there imports the names it
shows and lists stubs (``def f(...): ...``, methods inside ``class C:``, attributes as
``name: type``); each stub must have the real object's parameter names, order, kinds and
defaults, and the annotations it writes (the convention is stated at the top of DESIGN.md).
A mismatch names the DESIGN.md line and prints the code's signature, ready to paste."""
from __future__ import annotations

import ast
import importlib
import inspect
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "DESIGN.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


@dataclass
class Stub:
    where: str           # "DESIGN.md:LINE"
    qualname: str        # "ShardSink.__init__"
    node: ast.AST        # FunctionDef, or AnnAssign of an attribute
    owner: object        # the class (methods, attributes) or the function itself
    namespace: dict      # globals of the defining module: non-literal defaults are read there


def _blocks(text: str) -> list[tuple[int, str]]:
    """``(first line number, code)`` of each python block."""
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in BLOCK.finditer(text)]


def _stubs(text: str, doc_name: str = "DESIGN.md") -> tuple[list[Stub], list[str]]:
    """The stubs of every block, and the problems found while reading them (a name shown but
    not imported, an import that fails, a stub with a body, a block without a stub)."""
    stubs, problems = [], []
    for first, code in _blocks(text):
        tree = ast.parse(code)
        at = lambda node: f"{doc_name}:{first + node.lineno - 1}"  # noqa: E731
        names: dict[str, object] = {}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    if not hasattr(module, alias.name):
                        problems.append(f"{at(node)}: {node.module} has no {alias.name}")
                    names[alias.asname or alias.name] = getattr(module, alias.name, None)
        defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        if not defs:
            problems.append(f"{doc_name}:{first}: a python block without a def or class stub")
        for node in defs:
            obj = names.get(node.name)
            if obj is None:
                problems.append(f"{at(node)}: {node.name} is shown but not imported in its block")
                continue
            namespace = vars(sys.modules[obj.__module__])
            if isinstance(node, ast.FunctionDef):
                stubs.append(Stub(at(node), node.name, node, obj, namespace))
                continue
            for member in node.body:
                if isinstance(member, ast.FunctionDef):
                    stubs.append(Stub(at(member), f"{node.name}.{member.name}", member, obj,
                                      namespace))
                elif isinstance(member, ast.AnnAssign):
                    stubs.append(Stub(at(member), f"{node.name}.{member.target.id}", member,
                                      obj, namespace))
                elif not (isinstance(member, ast.Expr)
                          and isinstance(member.value, ast.Constant)):
                    problems.append(f"{at(member)}: only stubs belong in class {node.name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and not (
                    len(node.body) == 1 and isinstance(node.body[0], ast.Expr)
                    and isinstance(node.body[0].value, ast.Constant)):
                problems.append(f"{at(node)}: {node.name}'s body must be `...`")
    return stubs, problems


def _code_function(stub: Stub):
    """The real function a stub describes (a method as stored on its class: ``self`` or
    ``cls`` stays a parameter), or None when the class has no such member."""
    if not inspect.isclass(stub.owner):
        return stub.owner
    try:
        raw = inspect.getattr_static(stub.owner, stub.node.name)
    except AttributeError:
        return None
    if isinstance(raw, (staticmethod, classmethod)):
        raw = raw.__func__
    return raw.fget if isinstance(raw, property) else raw


def _normal(annotation) -> str:
    """An annotation as one canonical text (code annotations are strings here: every module
    has ``from __future__ import annotations``)."""
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    return ast.unparse(ast.parse(text.strip(), mode="eval"))


def _documented(node: ast.FunctionDef) -> list[tuple]:
    """``(name, kind, default node or None, annotation node or None)`` per stub parameter."""
    a, kinds = node.args, inspect.Parameter
    positional = [(x, kinds.POSITIONAL_ONLY) for x in a.posonlyargs] + [
        (x, kinds.POSITIONAL_OR_KEYWORD) for x in a.args]
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    out = [(x.arg, kind, d, x.annotation) for (x, kind), d in zip(positional, defaults)]
    if a.vararg:
        out.append((a.vararg.arg, kinds.VAR_POSITIONAL, None, a.vararg.annotation))
    out += [(x.arg, kinds.KEYWORD_ONLY, d, x.annotation) for x, d in zip(a.kwonlyargs,
                                                                          a.kw_defaults)]
    if a.kwarg:
        out.append((a.kwarg.arg, kinds.VAR_KEYWORD, None, a.kwarg.annotation))
    return out


def _mismatches(stub: Stub) -> list[str]:
    """What differs between ``stub`` and the code (empty: they agree)."""
    if isinstance(stub.node, ast.AnnAssign):
        has = inspect.isclass(stub.owner) and hasattr(stub.owner, stub.node.target.id)
        return [] if has else [f"{stub.where}: {stub.qualname} is not an attribute of the class"]
    func = _code_function(stub)
    try:
        real = inspect.signature(func)
    except (TypeError, ValueError):
        return [f"{stub.where}: {stub.qualname} is not a function in the code"]
    shown = _documented(stub.node)
    problems = []
    names = [(n, k) for n, k, _, _ in shown]
    if names != [(p.name, p.kind) for p in real.parameters.values()]:
        problems.append("parameters (names, order, kinds) differ")
    else:
        for (name, _, default, annotation), param in zip(shown, real.parameters.values()):
            if (default is None) != (param.default is inspect.Parameter.empty):
                problems.append(f"{name}: a default in one and not the other")
            elif default is not None:
                try:
                    value = ast.literal_eval(default)
                except ValueError:  # a name such as DEFAULT_TOLERANCE: the module's value
                    value = eval(compile(ast.Expression(default), stub.where, "eval"),
                                 dict(stub.namespace))
                if type(value) is not type(param.default) or value != param.default:
                    problems.append(f"{name}: default {ast.unparse(default)} but the code has "
                                    f"{param.default!r}")
            if annotation is not None and (param.annotation is inspect.Parameter.empty or
                                           _normal(param.annotation) != ast.unparse(annotation)):
                problems.append(f"{name}: annotation {ast.unparse(annotation)}")
    if stub.node.returns is not None and (
            real.return_annotation is inspect.Signature.empty
            or _normal(real.return_annotation) != ast.unparse(stub.node.returns)):
        problems.append(f"return annotation {ast.unparse(stub.node.returns)}")
    if not problems:
        return []
    return [f"{stub.where}: {stub.qualname}: {'; '.join(problems)}. The code: "
            f"{stub.node.name}{real}"]


def _check(text: str) -> tuple[list[Stub], list[str]]:
    stubs, problems = _stubs(text)
    return stubs, problems + [m for stub in stubs for m in _mismatches(stub)]


def test_every_documented_signature_is_the_codes():
    stubs, problems = _check(DESIGN.read_text(encoding="utf-8"))
    assert not problems, "docs/DESIGN.md is out of date:\n" + "\n".join(problems)
    shown = {s.qualname for s in stubs}
    # the contracts the page is read for are there (a deleted block is not "all match")
    assert {"make_loader", "FormatReader.__init__", "FormatWriter.add", "ShardSink.__init__",
            "ShardSink.add", "open_reader", "ShardSource.__init__", "load_index",
            "assign_splits"} <= shown, shown
    assert len(stubs) >= 30


PROBE = '''
```python
from shardkit.formats.sink import ShardSink
from shardkit.packer.assign import assign_splits

class ShardSink:
    def add(self, key: str, data: bytes, ext: str, label: str, meta=None): ...
    def close(self) -> list[dict]: ...
    def flush(self): ...

def assign_splits(samples, ratios, seed, tolerance=0.5, *, links=(), method="hash",
                  fixed=None): ...
def make_loader(root): ...
```
'''


def test_the_check_finds_each_kind_of_drift():
    """A wrong annotation, a missing method, a wrong default, swapped keyword-only parameters
    and a name not imported: each is reported, naming its line."""
    stubs, problems = _check(PROBE)
    assert [s.qualname for s in stubs] == ["ShardSink.add", "ShardSink.close", "ShardSink.flush",
                                           "assign_splits"]
    text = "\n".join(problems)
    assert "DESIGN.md:13: make_loader is shown but not imported" in text
    assert "DESIGN.md:7: ShardSink.add: label: annotation str. The code: add(self, " in text
    assert "ShardSink.close" not in text  # it matches
    assert "DESIGN.md:9: ShardSink.flush is not a function in the code" in text
    assert ("DESIGN.md:11: assign_splits: parameters (names, order, kinds) differ. The code: "
            "assign_splits(samples: 'Iterable[Any]', ratios") in text
    fixed = PROBE.replace("links=(), method=\"hash\"", "method=\"hash\", links=()")
    assert ("assign_splits: tolerance: default 0.5 but the code has 0.02"
            in "\n".join(_check(fixed)[1]))


@pytest.mark.parametrize("block, message", [
    ("x = 1\n", "a python block without a def or class stub"),
    ("from shardkit.stream.loader import make_loader\n\ndef make_loader(root):\n    return 1\n",
     "make_loader's body must be `...`"),
    ("from shardkit.stream.loader import nothing_here\n\ndef nothing_here(): ...\n",
     "shardkit.stream.loader has no nothing_here"),
])
def test_a_malformed_block_is_named(block, message):
    assert message in "\n".join(_check(f"```python\n{block}```\n")[1])
