"""Supervising child processes (what `specdeck run` does with the API and the worker): each child
in a session of its own that dies with its parent; SIGTERM, SIGINT or SIGHUP stops them all
(SIGTERM to each process group, SIGKILL after a timeout); a child that dies on its own is
restarted with backoff, and one that keeps dying makes the supervisor give up."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

try:  # loaded here, in the parent: a preexec function should do as little as it can
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: no parent-death signal
    _prctl = None


def die_with_parent(parent: int | None = None) -> None:
    """For ``Popen(preexec_fn=...)``: the child gets SIGTERM when its parent dies (Linux
    PR_SET_PDEATHSIG; strictly, when the parent's thread that started it ends). With ``parent``
    (the parent's pid, taken before the fork), a child whose parent already died in between
    terminates itself."""
    if _prctl is None:
        return
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Signal a process group; one that is gone already is no error."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def live_processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) for every live process, from /proc (a zombie is
    dead already, whatever its group)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
        if fields[0] != "Z":
            found[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return found


def descendants(pid: int, table: dict[int, tuple[int, int]] | None = None) -> list[int]:
    """The live descendants of ``pid``, from ``table`` (``live_processes()``; read now if not
    given)."""
    table = live_processes() if table is None else table
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def descendant_groups(pid: int) -> set[int]:
    """The process groups of ``pid``'s descendants: its own, and any they moved to (the worker
    starts each job's processes in a session of their own)."""
    try:
        table = live_processes()
    except OSError:  # no /proc
        return set()
    return {table[child][1] for child in descendants(pid, table)}


@dataclass(frozen=True)
class Child:
    name: str
    argv: Sequence[str]


@dataclass
class _State:
    child: Child
    proc: subprocess.Popen | None = None
    pgid: int | None = None  # its process group (its pid), until it has died and been cleared
    started: float = 0.0
    delay: float = 0.0
    restart_at: float = 0.0
    exits: deque[float] = field(default_factory=deque)


def _say(line: str) -> None:
    print(line, flush=True)


class Supervisor:
    """Runs ``children`` until a stop signal (SIGTERM, SIGINT, SIGHUP) or ``stop()``; restarts
    one that exits on its own after ``backoff`` seconds, doubling to ``max_backoff`` (back to
    ``backoff`` once it had run ``stable_after`` seconds); gives up when one exits more than
    ``max_exits`` times within ``exit_window`` seconds. Stopping: SIGTERM to each child's process
    group, SIGKILL to what is left after ``stop_timeout`` seconds."""

    def __init__(self, children: Sequence[Child], env: Mapping[str, str] | None = None,
                 stop_timeout: float = 120.0, *, backoff: float = 1.0, max_backoff: float = 30.0,
                 stable_after: float = 60.0, max_exits: int = 5, exit_window: float = 60.0,
                 tick: float = 0.2, say: Callable[[str], None] = _say) -> None:
        self.children = list(children)
        self.env = dict(env) if env is not None else None
        self.stop_timeout = stop_timeout
        self.backoff, self.max_backoff, self.stable_after = backoff, max_backoff, stable_after
        self.max_exits, self.exit_window = max_exits, exit_window
        self.tick = tick
        self.say = say
        self._states = [_State(c, delay=backoff) for c in self.children]
        # Set from signal handlers, so plain attributes: threading.Event.set() takes a lock the
        # interrupted main thread may be holding in Event.wait().
        self._signal: int | None = None
        self._stop_requested = False
        self._stopping = False

    def stop(self) -> None:
        """Ask run() (in another thread) to stop everything and return."""
        self._stop_requested = True

    def pids(self) -> dict[str, int | None]:
        return {s.child.name: (s.proc.pid if s.proc and s.proc.poll() is None else None)
                for s in self._states}

    def run(self) -> bool:
        """Start the children and supervise them until told to stop (True) or until one keeps
        dying (False). Stop signals are handled only while this runs (in the main thread)."""
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            for state in self._states:
                self._start(state)
            ok = self._supervise()
        finally:
            try:
                self._stop_all()
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
        return ok

    def _on_signal(self, signum: int, frame: object) -> None:
        if self._stopping:
            self._signal = -signum  # a signal while stopping: kill what is left now
        else:
            self._signal = signum

    def _start(self, state: _State) -> None:
        parent = os.getpid()
        state.proc = subprocess.Popen(list(state.child.argv), env=self.env,
                                      stdin=subprocess.DEVNULL, start_new_session=True,
                                      preexec_fn=lambda: die_with_parent(parent))
        state.pgid = state.proc.pid
        state.started = time.monotonic()

    def _supervise(self) -> bool:
        while True:
            if self._signal is not None:
                self.say(f"got {signal.Signals(self._signal).name}: "
                         f"stopping {self._names()} (up to {self.stop_timeout:g} s)")
                return True
            if self._stop_requested:
                self.say(f"stopping {self._names()} (up to {self.stop_timeout:g} s)")
                return True
            now = time.monotonic()
            for state in self._states:
                if state.proc is None:
                    if now >= state.restart_at:
                        self._start(state)
                    continue
                code = state.proc.poll()
                if code is None:
                    continue
                # What it left in its group goes now, while the number still names that group.
                signal_group(state.proc.pid, signal.SIGKILL)
                state.proc, state.pgid = None, None
                state.exits.append(now)
                while state.exits and state.exits[0] < now - self.exit_window:
                    state.exits.popleft()
                name = state.child.name
                if len(state.exits) > self.max_exits:
                    self.say(f"{name} exited with code {code}, {len(state.exits)} times within "
                             f"{self.exit_window:g} s: giving up; stopping {self._names()}")
                    return False
                if now - state.started >= self.stable_after:
                    state.delay = self.backoff
                self.say(f"{name} exited with code {code}; restarting in {state.delay:g} s")
                state.restart_at = now + state.delay
                state.delay = min(state.delay * 2, self.max_backoff)
            time.sleep(self.tick)

    def _names(self) -> str:
        return ", ".join(s.child.name for s in self._states)

    def _alive(self, state: _State) -> bool:
        if state.proc is not None and state.proc.poll() is None:
            return True
        return state.pgid is not None and group_alive(state.pgid)

    def _stop_all(self) -> None:
        self._stopping = True
        for state in self._states:
            if state.pgid is not None:
                signal_group(state.pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        hurried = False
        while any(self._alive(s) for s in self._states) and time.monotonic() < deadline:
            if self._signal is not None and self._signal < 0:
                hurried = True
                break
            time.sleep(min(self.tick, 0.05))
        for state in self._states:
            if not self._alive(state):
                continue
            # Its descendants' groups too, found before the kill orphans them.
            groups = {state.pgid} if state.pgid is not None else set()
            if state.proc is not None:
                groups |= descendant_groups(state.proc.pid)
            groups.discard(os.getpgrp())
            for pgid in groups:
                signal_group(pgid, signal.SIGKILL)
            if state.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    state.proc.kill()
            if hurried:
                came = signal.Signals(-self._signal).name
                self.say(f"{state.child.name} had not stopped when {came} came: killed")
            else:
                self.say(f"{state.child.name} did not stop within {self.stop_timeout:g} s: killed")
        for state in self._states:
            if state.proc is not None:
                state.proc.wait()
        self.say("stopped")
