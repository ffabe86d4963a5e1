"""`make test` relies on pytest-xdist's `--dist loadgroup`: the tests of one xdist_group run on
one worker, in order (tests/conftest.py groups the demo drafter's trainer with its servers, and
a module's tests with its module-scoped fixtures). pytest 9.2 broke that silently with
pytest-xdist 3.8 (every test was scheduled alone, xdist #1386): this runs the installed pair on
a suite of its own and fails if a group is split."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SUITE = '''
import pytest

@pytest.mark.xdist_group("together")
@pytest.mark.parametrize("i", range(4))
def test_grouped(i):
    pass

@pytest.mark.parametrize("i", range(4))
def test_alone(i):
    pass
'''


def test_a_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_suite.py").write_text(SUITE)
    run = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v",
                          "-p", "no:cacheprovider", str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    ran = re.findall(r"\[(gw\d)\] .*PASSED \S*::(test_\w+\[\d\])(\S*)", run.stdout)
    assert len(ran) == 8, run.stdout
    grouped = [(worker, suffix) for worker, test, suffix in ran if test.startswith("test_grouped")]
    assert len({worker for worker, _ in grouped}) == 1, run.stdout
    assert all(suffix == "@together" for _, suffix in grouped), run.stdout


def test_the_units_put_first_exist() -> None:
    """tests/conftest.py puts the longest work units first by their files' paths: a file
    renamed or moved would drop silently to its directory's place."""
    from tests.conftest import DEMO_DRAFTER_TRAINER, FIRST, ROOT

    assert all((ROOT / path).is_file() for path in FIRST), FIRST
    assert "tests/e2e/" + DEMO_DRAFTER_TRAINER in FIRST
