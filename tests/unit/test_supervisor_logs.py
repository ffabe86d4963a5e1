"""The job log as users read it: no padding from rich's fixed width, and ``tail`` gives as
many lines as asked however far back they start."""

from __future__ import annotations

import sys
from pathlib import Path

from app.logtail import TAIL_BLOCK, tail
from workers.supervisor import ManagedProcess


def test_padded_lines_are_stored_without_their_padding(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    child = "import sys; sys.stdout.write('train/loss=2.0' + ' ' * 990 + '\\n' + 'tail   ')"
    proc = ManagedProcess([sys.executable, "-c", child], env={}, log_path=log, job_id="job_x")
    assert proc.wait(lambda: False, grace=1) == 0
    assert log.read_text() == "train/loss=2.0\ntail"


def test_tail_reads_back_as_far_as_the_lines_asked_for(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    lines = [f"{i:05d} " + "x" * 200 for i in range(3000)]  # ~600 KB, far more than one block
    log.write_text("\n".join(lines) + "\n")
    assert log.stat().st_size > 8 * TAIL_BLOCK
    assert tail(log, 2000).splitlines() == lines[-2000:]
    assert tail(log, 5000).splitlines() == lines  # all there is
    assert tail(log, 1) == lines[-1]
    assert tail(tmp_path / "missing.log") == ""
