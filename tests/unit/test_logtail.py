"""Reading a log by offset (app/logtail.py): the last complete lines and where they end."""

from __future__ import annotations

from pathlib import Path

from app.logtail import read_after, tail_lines


def test_a_line_redrawn_with_carriage_returns_counts_once(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_bytes(b"a\nstep 1\rstep 2\rstep 3\nb\nbeing writ")
    end = len(b"a\nstep 1\rstep 2\rstep 3\nb\n")
    assert tail_lines(log, 2) == ("step 1\rstep 2\rstep 3\nb\n", end)
    assert read_after(log, 2) == ("step 1\rstep 2\rstep 3\nb\n", end)
    assert read_after(log, end) == ("", end)  # the line being written waits for its end
    assert tail_lines(tmp_path / "none.log", 5) == ("", 0) and read_after(tmp_path / "x", 3) == ("", 0)
