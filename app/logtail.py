"""The end of a log file, for a failed stage's reason and the logs API."""

from __future__ import annotations

import os
from pathlib import Path

TAIL_BLOCK = 64 * 1024
TAIL_MAX_BYTES = 32 * 1024 * 1024  # the most read back for one tail, however long the lines


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log, read back from its end block by block."""
    if not path.exists():
        return ""
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
    data = b"".join(reversed(blocks)).decode("utf-8", errors="replace")
    return "\n".join(data.splitlines()[-lines:])
