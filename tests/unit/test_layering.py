"""Imports point one way: workers/ uses app/'s domain, never the reverse. Under app/, only the
CLI entry point (app/cli.py: it starts a worker and makes the demo verifier) imports workers/."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = {Path("app/cli.py")}


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_nothing_under_app_imports_workers_except_the_cli() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(m for m in imported_modules(path)
                                            if m == "workers" or m.startswith("workers."))
        for path in sorted((ROOT / "app").rglob("*.py"))
        if path.relative_to(ROOT) not in ALLOWED
    }
    assert {f: m for f, m in offenders.items() if m} == {}


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from workers.supervisor import tail\n    import workers.tasks\n")
    assert imported_modules(module) == {"workers.supervisor", "workers.tasks"}
