"""`make install` builds the dashboard when frontend/package.json exists and Node.js >= 20 is on
PATH (again only when one of its files changed), and skips it silently otherwise; `make run`
says in one line how to get it while it is missing. The Makefile's own targets, in a copy of
it beside a small frontend/ whose build writes dist/index.html."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

BUILD = ("node -e \"require('fs').mkdirSync('dist', {recursive: true}); "
         "require('fs').appendFileSync('dist/index.html', 'built ')\"")
POSTINSTALL = "node -e \"require('fs').appendFileSync('installed', 'ci ')\""  # npm ci ran
HINT = "Dashboard not built"


def node_major() -> int:
    node = shutil.which("node")
    if node is None:
        return 0
    out = subprocess.run([node, "-p", "process.versions.node"], capture_output=True, text=True)
    return int(out.stdout.split(".")[0])


def project(tmp_path: Path, frontend: bool = True) -> Path:
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "frontend").mkdir()
    (tmp_path / "frontend" / "README.md").write_text("Dashboard\n")
    if frontend:
        package = {"name": "dash", "version": "0.0.0", "private": True,
                   "scripts": {"build": BUILD, "postinstall": POSTINSTALL}}
        lock = {"name": "dash", "version": "0.0.0", "lockfileVersion": 3, "requires": True,
                "packages": {"": {"name": "dash", "version": "0.0.0"}}}
        (tmp_path / "frontend" / "package.json").write_text(json.dumps(package))
        (tmp_path / "frontend" / "package-lock.json").write_text(json.dumps(lock))
    return tmp_path


def make(root: Path, target: str, path: str | None = None) -> str:
    """The target's output; the venv's targets are stood in for by an empty install stamp."""
    env = {**os.environ, "npm_config_audit": "false", "npm_config_fund": "false",
           "npm_config_update_notifier": "false"}
    env.pop("SPECDECK_DASHBOARD_DIR", None)
    if path is not None:
        env["PATH"] = path
    done = subprocess.run([shutil.which("make") or "make", "-s", "-C", str(root), target,
                           "-o", ".venv/.installed"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def path_without_node(tmp_path: Path) -> str:
    """A PATH with the tools the Makefile uses, and no node."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("find", "sh"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    return str(bin_dir)


@pytest.mark.skipif(node_major() < 20, reason="needs Node.js >= 20 on PATH")
def test_install_builds_the_dashboard_once_and_again_when_it_changes(tmp_path: Path) -> None:
    root = project(tmp_path)
    index = root / "frontend" / "dist" / "index.html"
    make(root, "install")
    assert index.read_text() == "built "
    make(root, "install")  # nothing changed: not built again
    assert index.read_text() == "built "
    source = root / "frontend" / "README.md"
    os.utime(source, (index.stat().st_mtime + 10, index.stat().st_mtime + 10))
    make(root, "install")
    assert index.read_text() == "built built "
    assert (root / "frontend" / "installed").read_text() == "ci ci "


def test_without_node_install_skips_the_dashboard_and_run_says_how_to_get_it(
        tmp_path: Path) -> None:
    root = project(tmp_path)
    path = path_without_node(tmp_path)
    assert make(root, "install", path) == ""
    assert not (root / "frontend" / "dist").exists()
    hint = make(root, "dashboard-hint", path)
    assert len(hint.splitlines()) == 1 and hint.startswith(HINT)
    assert "Node.js >= 20" in hint and "npm ci && npm run build" in hint
    (root / "frontend" / "dist").mkdir()
    (root / "frontend" / "dist" / "index.html").write_text("built")
    assert make(root, "dashboard-hint", path) == ""


def test_with_no_frontend_yet_nothing_is_built_or_said(tmp_path: Path) -> None:
    root = project(tmp_path, frontend=False)
    assert make(root, "install") == ""
    assert make(root, "dashboard-hint") == ""
    assert not (root / "frontend" / "dist").exists()


def test_run_says_it_before_it_starts() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "\nrun: install dashboard-hint\n" in makefile
