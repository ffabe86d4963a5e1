"""Subprocess supervision: each stage in its own process group, output to the job's log,
SIGTERM then SIGKILL on stop, and reaping of orphans left by a dead worker."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from app.supervise import signal_group

log = logging.getLogger(__name__)

JOB_ENV = "SPECDECK_JOB_ID"


def redact(line: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret:
            line = line.replace(secret, "***")
    return line


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ManagedProcess:
    """One command in its own session (so its own process group), its output in ``log_path``."""

    def __init__(self, argv: list[str], *, env: dict[str, str], log_path: Path, job_id: str,
                 secrets: Iterable[str] = (), on_line: Callable[[str], None] | None = None,
                 cwd: Path | None = None, description: str = "process") -> None:
        full_env = {**os.environ, **env, JOB_ENV: job_id}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.argv = argv
        self.description = description
        self._started = time.monotonic()
        self._ended: float | None = None
        self.secrets = [s for s in secrets if s]
        self.on_line = on_line
        self.log_path = log_path
        self.proc = subprocess.Popen(argv, env=full_env, cwd=cwd, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.pgid = self.proc.pid
        self.line_error: BaseException | None = None
        self._reader = threading.Thread(target=self._pump, name=f"pump-{self.pgid}", daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        with self.log_path.open("a", encoding="utf-8") as out:
            for raw in self.proc.stdout:
                line = redact(raw.decode("utf-8", errors="replace"), self.secrets)
                # Trainers print through rich at COLUMNS=1000 (one record per line), which pads
                # every line with spaces to that width: not worth storing or showing.
                line = line.rstrip() + "\n" if line.endswith("\n") else line.rstrip(" ")
                out.write(line)
                out.flush()
                if self.on_line is not None and self.line_error is None:
                    try:
                        self.on_line(line.rstrip("\n"))
                    except BaseException as exc:  # kept and re-raised by wait()
                        self.line_error = exc

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is not None and self._ended is None:
            self._ended = time.monotonic()
        return code

    @property
    def seconds(self) -> float:
        """How long it ran (so far, if it still runs)."""
        return (self._ended or time.monotonic()) - self._started

    def wait(self, should_stop: Callable[[], bool], *, grace: float, tick: float = 0.2) -> int:
        """Wait for exit; when ``should_stop()`` turns true, stop the group and return."""
        while True:
            try:
                code = self.proc.wait(timeout=tick)
                self.poll()
                break
            except subprocess.TimeoutExpired:
                if should_stop():
                    code = self.stop(grace)
                    break
        signal_group(self.pgid, signal.SIGKILL)  # anything the command left in its group
        self._reader.join(timeout=10)
        if self.line_error is not None:
            raise self.line_error
        return code

    def stop(self, grace: float) -> int:
        """SIGTERM the group, wait up to ``grace`` seconds, then SIGKILL."""
        signal_group(self.pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if self.proc.poll() is not None and not group_alive(self.pgid):
                break
            time.sleep(0.05)
        signal_group(self.pgid, signal.SIGKILL)
        code = self.proc.wait()
        self.poll()
        self._reader.join(timeout=10)
        return code


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    members.append(int(entry.name))
            except ProcessLookupError:
                continue
    return members


def _belongs_to(pid: int, job_id: str) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return f"{JOB_ENV}={job_id}".encode() in environ.split(b"\0")


def reap(pgid: int, job_id: str, grace: float = 5.0) -> bool:
    """Kill an orphaned process group, but only if it really runs this job (pgids get reused)."""
    if not any(_belongs_to(pid, job_id) for pid in _group_members(pgid)):
        return False
    log.warning("reaping orphaned process group %s of %s", pgid, job_id)
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and group_alive(pgid):
        time.sleep(0.05)
    signal_group(pgid, signal.SIGKILL)
    return True


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
