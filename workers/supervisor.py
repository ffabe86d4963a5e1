"""Subprocess supervision: each stage in its own process group, output to the job's log,
SIGTERM then SIGKILL on stop, and stopping the orphans a dead worker left (``Group``, ``reap``)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.supervise import group_alive, live_processes, signal_group

log = logging.getLogger(__name__)

JOB_ENV = "SPECDECK_JOB_ID"


def redact(line: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret:
            line = line.replace(secret, "***")
    return line


class ManagedProcess:
    """One command in its own session (so its own process group), its output in ``log_path``:
    through a pipe that the worker reads (secrets redacted, each line to ``on_line``) or, for a
    process that is to outlive the worker (``outlives_worker``: a serving engine), written to
    the file by the process itself, so it has somewhere to write once the worker is gone."""

    def __init__(self, argv: list[str], *, env: dict[str, str], log_path: Path, job_id: str,
                 secrets: Iterable[str] = (), on_line: Callable[[str], None] | None = None,
                 cwd: Path | None = None, description: str = "process",
                 outlives_worker: bool = False) -> None:
        assert not (outlives_worker and on_line), "its lines do not pass through the worker"
        # Unbuffered: its output reaches the log (progress, a crash's last lines) as it is
        # written, not when a pipe's buffer fills; a SIGKILLed process loses nothing.
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **env, JOB_ENV: job_id}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.argv = argv
        self.description = description
        self._started = time.monotonic()
        self._ended: float | None = None
        self.secrets = [s for s in secrets if s]
        self.on_line = on_line
        self.log_path = log_path
        with contextlib.ExitStack() as files:
            out = (files.enter_context(log_path.open("ab")) if outlives_worker
                   else subprocess.PIPE)
            self.proc = subprocess.Popen(argv, env=full_env, cwd=cwd, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.pgid = self.proc.pid
        self.line_error: BaseException | None = None
        self.stopped: str | None = None  # "term" once stop() sent SIGTERM, "kill" once SIGKILL
        self.grace = 0.0  # the seconds stop() waited between them
        self._reader = threading.Thread(target=self._pump, name=f"pump-{self.pgid}", daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        if self.proc.stdout is None:
            return
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

    def wait(self, should_stop: Callable[[], bool], *, grace: float | Callable[[], float],
             tick: float = 0.2) -> int:
        """Wait for exit; when ``should_stop()`` turns true, stop the group (``grace``: seconds,
        or what gives them at that moment) and return."""
        while True:
            try:
                code = self.proc.wait(timeout=tick)
                self.poll()
                break
            except subprocess.TimeoutExpired:
                if should_stop():
                    code = self.stop(grace() if callable(grace) else grace)
                    break
        signal_group(self.pgid, signal.SIGKILL)  # anything the command left in its group
        self._reader.join(timeout=10)
        if self.line_error is not None:
            raise self.line_error
        return code

    def stop(self, grace: float) -> int:
        """SIGTERM the group, wait up to ``grace`` seconds, then SIGKILL."""
        self.grace = grace
        self.stopped = stop_group(self.pgid, grace, lambda: self.proc.poll() is not None)
        code = self.proc.wait()
        self.poll()
        self._reader.join(timeout=10)
        return code


def stop_group(pgid: int, grace: float, leader_exited: Callable[[], bool]) -> str:
    """SIGTERM the group, wait up to ``grace`` seconds for it to end, then SIGKILL what is
    left. Returns "term" when its leader exited within the grace, "kill" when it had not."""
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if leader_exited() and not group_alive(pgid):
            break
        time.sleep(0.05)
    stopped = "term" if leader_exited() else "kill"
    signal_group(pgid, signal.SIGKILL)
    return stopped


# What an adopted process's exit code reads as: it is not this worker's child, so its code
# went with the worker that started it.
EXIT_UNKNOWN = -256


class AdoptedProcess:
    """A process group that an earlier run of this worker started and this one took over (a
    serving engine that outlived it, and the preloader it was forked from): watched and
    stopped through its group, like a ``ManagedProcess``; its exit code is ``EXIT_UNKNOWN``."""

    def __init__(self, group: Group, description: str) -> None:
        self.group, self.pgid, self.description = group, group.pgid, description
        self.stopped: str | None = None
        self.grace = 0.0
        self._started = time.monotonic()
        self._ended: float | None = None

    def poll(self) -> int | None:
        if self._ended is None and not (self.group.is_current() and _start_time(self.pgid)):
            self._ended = time.monotonic()
        return None if self._ended is None else EXIT_UNKNOWN

    @property
    def seconds(self) -> float:
        """How long it ran since it was adopted."""
        return (self._ended or time.monotonic()) - self._started

    def stop(self, grace: float) -> int:
        self.grace = grace
        self.stopped = stop_group(self.pgid, grace, lambda: self.poll() is not None)
        return EXIT_UNKNOWN


def exit_words(code: int | None, stopped: str | None, grace: float = 0.0) -> str:
    """How a process ended, in words (its code a number only where it chose one): "stopped by
    SpecDeck", "killed after the grace period (5 s)", "killed by SIGKILL", "exited with code 1"."""
    if stopped == "kill":
        return f"killed after the grace period ({grace:g} s) it was given to stop"
    if stopped == "term":
        return "stopped by SpecDeck" + (f" (exit code {code})" if code and code > 0 else "")
    if code == 0:
        return "exited normally"
    if code == EXIT_UNKNOWN:
        return "exited (how is not known: it was adopted from an earlier run of the worker)"
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        why = " (the host ran out of memory, or it was killed by hand)" if -code == signal.SIGKILL \
            else ""
        return f"killed by {name}{why}"
    return f"exited with code {code}"


# What a job or deployment runs: a process it started, or one it adopted.
Process = ManagedProcess | AdoptedProcess


def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _start_time(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (field 22 of /proc/<pid>/stat): with
    the boot id, what tells a process from a later one that got the same PID. None once it
    has ended."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else int(fields[19])  # a zombie has ended


@dataclass(frozen=True)
class Group:
    """A process group a job started, as recorded on its row: enough to find it again after
    the worker died, and never to take a later group with the same id for it."""

    pgid: int
    started: int | None  # the leader's start time (None on rows written before it was kept)
    boot: str | None

    @classmethod
    def of(cls, pgid: int) -> Group:
        return cls(pgid, _start_time(pgid), _boot_id())

    @classmethod
    def from_json(cls, value: int | dict[str, Any]) -> Group:
        if isinstance(value, int):
            return cls(value, None, None)
        return cls(int(value["pgid"]), value.get("started"), value.get("boot"))

    def to_json(self) -> dict[str, Any]:
        return {"pgid": self.pgid, "started": self.started, "boot": self.boot}

    def leads(self) -> bool:
        """Whether the process that led the group when it was recorded still runs."""
        return (self.started is not None and (self.boot is None or self.boot == _boot_id())
                and _start_time(self.pgid) == self.started)

    def is_current(self) -> bool:
        """Still the group that was recorded: same boot and, while its leader lives, the same
        leader. (A leader that died leaves its group's id unused until the last member goes, so
        members of a group whose leader is gone are still the recorded group's.)"""
        if self.boot is not None and self.boot != _boot_id():
            return False
        started = _start_time(self.pgid)
        return started is None or self.started is None or started == self.started


def _group_members(pgids: list[int]) -> dict[int, int]:
    """pid -> process group, for the live processes of ``pgids``."""
    return {pid: group for pid, (_, group) in live_processes().items() if group in pgids}


def belongs_to(pid: int, job_id: str) -> bool:
    """Whether ``pid`` runs for ``job_id`` (a job's or deployment's id): the marker every
    process it starts carries in its environment."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return f"{JOB_ENV}={job_id}".encode() in environ.split(b"\0")


def reap(groups: list[Group], job_id: str, grace: float = 5.0) -> list[int]:
    """Stop the process groups a dead worker left behind for one job or deployment (SIGTERM,
    ``grace`` seconds, SIGKILL), but only those still the ones recorded, and in them only if
    they run this job. All at once: stopping one group can end a process of another (a launcher
    whose preloader is gone), which is as much the job's. Returns the PIDs stopped (vLLM's
    EngineCore included: it lives in its API server's group)."""
    current = [group.pgid for group in groups if group.is_current()]
    members = {pid: pgid for pid, pgid in _group_members(current).items()
               if belongs_to(pid, job_id)}
    ours = sorted(set(members.values()))  # the groups the job's processes are in
    if not ours:
        return []
    log.warning("stopping orphaned process groups %s of %s (pids %s)", ours, job_id,
                sorted(members))
    for pgid in ours:
        signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _group_members(ours):
        time.sleep(0.05)
    for pgid in ours:
        signal_group(pgid, signal.SIGKILL)
    return sorted(members)
