"""`make test` runs the suite in two runs of pytest under xdist (the integration and unit tests,
then the end-to-end and local-runtime tests): both always run, with PYTEST_ARGS;
either failing fails the target, and pytest's "no tests collected" (5) does not. The Makefile's
own target, in a copy of it whose venv python records its arguments and exits as told."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

PYTHON = """#!/bin/sh
echo "$*" >> "$CALLS"
case "$*" in *tests/integration*) exit "$FIRST_RC";; *) exit "$SECOND_RC";; esac
"""


def make_test(tmp_path: Path, first: int, second: int, *args: str) -> tuple[int, list[str]]:
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(PYTHON)
    python.chmod(0o755)
    calls = tmp_path / "calls.log"
    # The Makefile's variables come from the arguments only: a run of the suite under
    # `PYTEST_ARGS=... make test` (docs/ci.md) must not reach this copy through the environment.
    inherited = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ARGS", "TEST_WORKERS")}
    env = {**inherited, "CALLS": str(calls), "FIRST_RC": str(first), "SECOND_RC": str(second)}
    done = subprocess.run([shutil.which("make") or "make", "-s", "-C", str(tmp_path), "test",
                           "-o", "install", "-o", "services", *args],
                          env=env, capture_output=True, text=True, timeout=60)
    return done.returncode, calls.read_text().splitlines()


def test_both_runs_with_the_arguments(tmp_path: Path) -> None:
    status, calls = make_test(tmp_path, 0, 0, "PYTEST_ARGS=--durations=25")
    assert status == 0
    assert calls == [
        "-m pytest tests/integration tests/unit -n 2 --dist loadgroup --durations=25",
        "-m pytest tests/e2e tests/local_runtime -n 2 --dist loadgroup --durations=25"]


def test_the_workers_are_a_variable(tmp_path: Path) -> None:
    _, calls = make_test(tmp_path, 0, 0, "TEST_WORKERS=8")
    assert calls == ["-m pytest tests/integration tests/unit -n 8 --dist loadgroup",
                     "-m pytest tests/e2e tests/local_runtime -n 8 --dist loadgroup"]


@pytest.mark.parametrize(("first", "second", "fails"), [
    (1, 0, True), (0, 1, True), (2, 0, True), (1, 1, True),
    (5, 0, False), (0, 5, False), (5, 5, False)])
def test_either_failing_fails_and_both_run(tmp_path: Path, first: int, second: int,
                                            fails: bool) -> None:
    status, calls = make_test(tmp_path, first, second)
    assert len(calls) == 2  # the second runs even when the first failed
    assert (status != 0) is fails
