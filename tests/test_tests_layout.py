"""tests/README.md names every test file (and only existing ones), and no test module imports
another test module: shared code lives in conftest.py and helpers.py."""
from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
README = TESTS / "README.md"


def _test_files() -> set[str]:
    return {p.name for p in TESTS.glob("test_*.py")}


def test_readme_names_every_test_file_and_only_real_ones():
    named = set(re.findall(r"`(test_\w+\.py)`", README.read_text(encoding="utf-8")))
    files = _test_files()
    assert len(files) > 40
    assert not files - named, f"tests/README.md does not say what these test: {files - named}"
    assert not named - files, f"tests/README.md names files that do not exist: {named - files}"


def _imported_test_modules(path: Path) -> list[str]:
    """Names of test modules (``test_*``, ``tests.*``) that ``path`` imports, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        found += [n for n in names if re.match(r"(tests\.|test_)", n)]
    return found


def test_the_import_check_sees_every_form(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import test_a\nfrom test_b import x\ndef f():\n"
                     "    from tests.test_c import y\nfrom helpers import build_split\n"
                     "import testing\n", encoding="utf-8")
    assert _imported_test_modules(probe) == ["test_a", "test_b", "tests.test_c"]


def test_no_test_module_imports_another():
    imports = {p.name: _imported_test_modules(p) for p in sorted(TESTS.glob("*.py"))}
    offenders = {name: mods for name, mods in imports.items() if mods}
    assert not offenders, f"move shared code to conftest.py or helpers.py: {offenders}"
