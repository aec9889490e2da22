"""Distinct things have distinct names: no public class name is defined in two modules of ours.

Two ``Outcome``s, ``Verdict``s or ``Report``s in one code base make a reader (and an import
completion) pick the wrong one. The documented re-export paths (``launcher.report``,
``launcher.records``, ``launcher.rendezvous_plugin``, ``ft_core``'s public paths) define no class:
they are the module they name, so they cannot clash.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("ft_core", "launcher", "ptl_resiliency")


def _module_level_classes(tree: ast.Module) -> list[str]:
    """Classes defined at module level, also under a module-level ``if`` or ``try``."""
    names, pending = [], list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, (ast.If, ast.Try)):
            pending += [*node.body, *node.orelse, *getattr(node, "finalbody", []),
                        *(s for h in getattr(node, "handlers", []) for s in h.body)]
    return names


def public_classes_by_name(root: Path) -> dict[str, list[str]]:
    """Public class name -> the modules (paths) that define it."""
    found: dict[str, list[str]] = defaultdict(list)
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            for name in _module_level_classes(ast.parse(path.read_text(encoding="utf-8"))):
                if not name.startswith("_"):
                    found[name].append(path.relative_to(root).as_posix())
    return found


def test_no_public_class_name_is_defined_in_two_modules():
    found = public_classes_by_name(REPO)
    assert len(found) > 100  # every module was read
    clashes = {name: paths for name, paths in found.items() if len(paths) > 1}
    assert not clashes, f"one class name, several classes (rename them to say what each is): {clashes}"


def test_a_clash_is_found_also_under_an_if(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "ft_core" / "a.py").write_text("class Outcome:\n    pass\nclass _Private:\n    pass\n")
    (tmp_path / "launcher" / "b.py").write_text("import sys\nif sys:\n    class Outcome:\n        pass\n"
                                                "class _Private:\n    pass\n")
    found = public_classes_by_name(tmp_path)
    assert found == {"Outcome": ["ft_core/a.py", "launcher/b.py"]}
