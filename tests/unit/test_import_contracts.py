"""The import contracts in pyproject.toml ([tool.importlinter]), checked by import-linter's own
command on this tree; and, on a copy of it with one forbidden import added, shown to fail."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = str(Path(sys.executable).parent / "lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=root, capture_output=True, text=True,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, timeout=120)


def test_the_tree_keeps_its_import_contracts() -> None:
    checked = lint_imports(ROOT)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Contracts: 3 kept, 0 broken." in checked.stdout


@pytest.mark.parametrize(("module", "line", "broken"), [
    ("app/services/quotas.py", "import workers.tasks", "app/ never imports workers/"),
    ("app/services/state.py", "from app.services import deployments", "no import cycle"),
    ("app/db/__init__.py", "from app.services import keys", "the services over the database"),
], ids=["app imports workers", "a cycle among the services", "the database imports a service"])
def test_a_forbidden_import_breaks_a_contract(tmp_path: Path, module: str, line: str,
                                              broken: str) -> None:
    copy = tmp_path / "tree"
    for part in ("app", "workers"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    source = copy / module
    source.write_text(source.read_text() + f"\n{line}  # the scratch change\n")
    checked = lint_imports(copy)
    assert checked.returncode != 0
    assert "Contracts: 2 kept, 1 broken." in checked.stdout, checked.stdout
    assert broken in checked.stdout.split("Broken contracts", 1)[1]
