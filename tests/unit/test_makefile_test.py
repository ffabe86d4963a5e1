"""`make test` runs the whole suite in one run of pytest under xdist, in the order
tests/conftest.py gives it, with PYTEST_ARGS and TEST_WORKERS; pytest's exit status is the
target's. The Makefile's own target, in a copy of it whose venv python records its arguments
and exits as told."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

PYTHON = """#!/bin/sh
echo "$*" >> "$CALLS"
exit "$RC"
"""


def make_test(tmp_path: Path, rc: int, *args: str) -> tuple[int, list[str]]:
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(PYTHON)
    python.chmod(0o755)
    calls = tmp_path / "calls.log"
    # The Makefile's variables come from the arguments only: a run of the suite under
    # `PYTEST_ARGS=... make test` (docs/ci.md) must not reach this copy through the environment.
    inherited = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ARGS", "TEST_WORKERS")}
    env = {**inherited, "CALLS": str(calls), "RC": str(rc)}
    done = subprocess.run([shutil.which("make") or "make", "-s", "-C", str(tmp_path), "test",
                           "-o", "install", "-o", "services", *args],
                          env=env, capture_output=True, text=True, timeout=60)
    return done.returncode, calls.read_text().splitlines()


def test_one_run_in_the_suites_order_with_the_arguments(tmp_path: Path) -> None:
    status, calls = make_test(tmp_path, 0, "PYTEST_ARGS=--durations=25")
    assert status == 0
    assert calls == ["-m pytest tests -n 3 --dist loadgroup --no-loadscope-reorder --durations=25"]


def test_the_workers_are_a_variable(tmp_path: Path) -> None:
    _, calls = make_test(tmp_path, 0, "TEST_WORKERS=8")
    assert calls == ["-m pytest tests -n 8 --dist loadgroup --no-loadscope-reorder"]


@pytest.mark.parametrize("rc", [1, 2, 5])
def test_a_failing_run_fails_the_target(tmp_path: Path, rc: int) -> None:
    status, calls = make_test(tmp_path, rc)
    assert len(calls) == 1
    assert status != 0
