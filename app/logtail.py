"""The end of a log file, for a failed stage's reason and the logs API."""

from __future__ import annotations

import os
from pathlib import Path

TAIL_BLOCK = 64 * 1024
TAIL_MAX_BYTES = 32 * 1024 * 1024  # the most read back for one tail, however long the lines


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log, read back from its end block by block."""
    data, _ = _read_back(path, lines)
    return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-lines:])


def tail_lines(path: Path, lines: int) -> tuple[str, int]:
    """The last ``lines`` complete lines of a log, and the offset where they end: the cursor
    for ``read_after`` (a line still being written comes with the next read)."""
    data, start = _read_back(path, lines)
    complete = data.rfind(b"\n") + 1
    # Split at newlines only: a progress bar redrawn with "\r" is one line, as the reader shows it.
    kept = data[:complete].split(b"\n")[:-1][-lines:]
    return b"".join(line + b"\n" for line in kept).decode("utf-8", errors="replace"), start + complete


def _read_back(path: Path, lines: int) -> tuple[bytes, int]:
    """The log's end, back to at least ``lines`` newlines (or TAIL_MAX_BYTES), and its offset."""
    if not path.exists():
        return b"", 0
    blocks: list[bytes] = []
    newlines = 0
    with path.open("rb") as f:
        end = position = f.seek(0, os.SEEK_END)
        while position > 0 and newlines <= lines and end - position < TAIL_MAX_BYTES:
            size = min(TAIL_BLOCK, position)
            position -= size
            f.seek(position)
            blocks.append(f.read(size))
            newlines += blocks[-1].count(b"\n")
    return b"".join(reversed(blocks)), position


# The most one read of new lines returns: a reader that fell further behind skips ahead.
FOLLOW_MAX_BYTES = 1024 * 1024


def read_after(path: Path, offset: int) -> tuple[str, int]:
    """The complete lines written after byte ``offset`` (at most about FOLLOW_MAX_BYTES: the
    newest ones) and the offset after them. An offset past the end (a log written anew) reads
    from the start."""
    if not path.exists():
        return "", 0
    with path.open("rb") as f:
        end = f.seek(0, os.SEEK_END)
        if offset > end:
            offset = 0
        start = max(offset, end - FOLLOW_MAX_BYTES)
        f.seek(start)
        data = f.read(end - start)
    complete = data.rfind(b"\n") + 1
    if complete == 0:
        return "", offset
    data = data[:complete]
    if start > offset:  # skipped ahead: from the first whole line on
        data = data[data.find(b"\n") + 1:]
    return data.decode("utf-8", errors="replace"), start + complete
