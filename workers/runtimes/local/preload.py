"""Python imported once per job: a preloader forks the local runtime's Python processes.

A job of the local runtime starts vLLM servers (hidden states, the evaluation's engines),
speculators' prepare-data and the trainer, and each one's start is mostly its imports: vLLM's
API server about 13 of 22 s on 2 cores (docs/benchmarks.md, "vLLM forked from a preloader"),
prepare-data and the trainer about 6 s each, nearly all of it torch and transformers, which vLLM
imports too.
Here those imports are paid once per job (and once per deployment, for its engines):

- **preloader** (``python -m workers.runtimes.local.preload preloader SOCKET``): started by the
  job (workers/runner.py) with the environment of its first such process, in a session of its
  own like every process a job starts; imports vLLM's API server (with serve.py's forked engine
  core), prepare-data's and the trainer's modules (``FORKED``), then, for each launcher that
  connects to its Unix socket, forks a **server**. The servers stay in its process group and
  inherit its environment block, so what finds a job's processes (the job's id in
  ``/proc/PID/environ``, the recorded groups) finds them. It is a child subreaper: a process
  whose server died (vLLM's engine core) is handed to it, and it kills it.
- **server** (the preloader's child): takes the launcher's stdio, working directory and
  environment, then runs the launcher's module as ``python -m`` would. It dies, with what it
  started, when its launcher's pipe reaches end-of-file: when the launcher is gone, however it
  died.
- **launcher** (``python -m workers.runtimes.local.preload launch MODULE ARGS``): what the worker
  starts in place of ``python -m MODULE ARGS`` when the job has a preloader (``launcher_argv``),
  with ``PRELOADER_ENV`` naming the socket. It hands over the module, its arguments, environment,
  cwd and stdio, forwards SIGTERM and SIGINT to the server and exits with its status, so the
  worker supervises it exactly as it supervised the command itself. With no preloader to reach,
  it runs the module itself.

What a module reads from the environment when it is imported comes from the preloader's, the
job's: the same for all its processes (the threads OpenMP may use, which differ, are set again in
each server from its own ``OMP_NUM_THREADS``). The socket lives in a directory only the job's
user can enter (0700): whoever connects can start a process as that user.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import NoReturn

from app.supervise import descendants, live_processes

PRELOADER_ENV = "SPECDECK_VLLM_PRELOADER"  # the preloader's socket, in a launcher's environment
MODULE = "workers.runtimes.local.preload"
SERVE = "workers.runtimes.local.serve"  # vLLM's API server, its engine core forked
# What a preloader forks: the modules a local job runs with ``python -m``, and what each imports
# (prepare-data's command is ``python -m speculators prepare-data``; the trainer's entry point
# imports speculators' trainer when it runs).
FORKED = {SERVE: (SERVE,), "speculators": ("speculators.cli",),
          "workers.runtimes.local.train": ("workers.runtimes.local.train", "speculators.train.cli")}
READY_TIMEOUT = 120.0  # how long a launcher waits for the preloader's imports
PR_SET_CHILD_SUBREAPER = 36


def preloader_argv(path: str, *modules: str) -> list[str]:
    """The preloader's command; it imports ``modules`` (default: what ``FORKED`` names)."""
    return [sys.executable, "-m", MODULE, "preloader", path, *modules]


def preloader_socket(argv: Sequence[str]) -> str | None:
    """The socket of the preloader whose command is ``argv`` (None: not a preloader's)."""
    return argv[4] if len(argv) > 4 and list(argv[1:4]) == ["-m", MODULE, "preloader"] else None


def forks(argv: Sequence[str]) -> bool:
    """Whether a preloader can start ``argv``: ``python -m`` one of the ``FORKED`` modules."""
    return list(argv[:2]) == [sys.executable, "-m"] and len(argv) > 2 and argv[2] in FORKED


def launcher_argv(argv: Sequence[str]) -> list[str]:
    """``python -m MODULE ARGS`` (``forks(argv)``) as the launcher that has it forked."""
    return [sys.executable, "-m", MODULE, "launch", *argv[2:]]


def preload(path: str, modules: Sequence[str]) -> NoReturn:
    """The preloader: import the servers' modules once (vLLM's API server with serve.py's forked
    engine core, prepare-data's, the trainer's), then fork a server per launcher."""
    began = time.monotonic()
    with open(path + ".pid", "w") as pid_file:  # a launcher stops waiting once this pid is gone
        pid_file.write(str(os.getpid()))
    for module in modules or [m for imports in FORKED.values() for m in imports]:
        importlib.import_module(module)
        if module == SERVE:
            sys.modules[SERVE].prepare()
    # What was imported, out of the garbage collector's sight (Python's advice for fork without
    # exec): a forked server's collections neither walk those objects nor write to their pages,
    # which would copy them from the preloader's.
    gc.freeze()
    with contextlib.suppress(OSError, AttributeError):  # not Linux: orphans go to init
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + ".tmp")
    listener.listen(16)
    os.rename(path + ".tmp", path)  # connectable once it exists
    print(f"preloaded in {time.monotonic() - began:.1f} s; the job's processes fork from here",
          flush=True)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    launchers: dict[int, socket.socket] = {}  # server pid -> its launcher's connection
    while True:
        ready, _, _ = select.select([listener, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
            reap(launchers)
        if listener in ready:
            conn, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 4)
            pid = os.fork()
            if pid == 0:
                for other in (listener, conn, *launchers.values()):
                    other.close()
                for fd in (wake_r, wake_w):
                    os.close(fd)
                serve(json.loads(message), fds)
            for fd in fds:
                os.close(fd)
            conn.send(str(pid).encode())
            launchers[pid] = conn


def reap(launchers: dict[int, socket.socket]) -> None:
    """Collect every child that ended: a server's status goes to its launcher. Then kill what
    was handed to this subreaper (an engine core whose server died)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        if (conn := launchers.pop(pid, None)) is not None:
            with contextlib.suppress(OSError):  # a launcher that was killed
                conn.send(str(os.waitstatus_to_exitcode(status)).encode())
            conn.close()
    me = os.getpid()
    for pid, (parent, _) in live_processes().items():
        if parent == me and pid not in launchers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def serve(request: dict, fds: list[int]) -> NoReturn:
    """In the forked child: become the launcher's server; never returns."""
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    stdin, stdout, stderr, launcher_gone = fds
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if "torch" in sys.modules and (threads := os.environ.get("OMP_NUM_THREADS", "")).isdigit():
        sys.modules["torch"].set_num_threads(int(threads))  # OpenMP read it at the import
    threading.Thread(target=die_with_the_launcher, args=(launcher_gone,), daemon=True).start()
    code = 1  # what Python exits with when the module raises
    try:
        code = run(request["module"], request["argv"])
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)  # never back into the preloader's loop


def run(module: str, argv: Sequence[str]) -> int:
    """``python -m module argv`` in this interpreter; its exit status."""
    sys.argv = [module, *argv]
    if not hasattr(sys.modules.get(module), "__path__"):  # a package runs its __main__
        sys.modules.pop(module, None)  # run afresh as __main__ (its imports are what was loaded)
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def die_with_the_launcher(launcher_gone: int) -> None:
    while os.read(launcher_gone, 1):
        pass
    me = os.getpid()
    for pid in descendants(me):  # the engine core
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    os.kill(me, signal.SIGKILL)


def connect(path: str, timeout: float = READY_TIMEOUT) -> socket.socket | None:
    """The preloader's connection once its imports are done; None if it can't be reached."""
    deadline = time.monotonic() + timeout
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.connect(path)
            return conn
        except (FileNotFoundError, ConnectionRefusedError):
            conn.close()
            if time.monotonic() > deadline or not os.path.isdir(os.path.dirname(path)) \
                    or not alive(path + ".pid"):
                return None
            time.sleep(0.05)


def alive(pid_path: str) -> bool:
    """Whether the preloader that wrote ``pid_path`` still runs (yes, until it has written it:
    it is being started)."""
    try:
        with open(pid_path) as pid_file:
            pid = int(pid_file.read())
    except (FileNotFoundError, ValueError):
        return True
    return pid in live_processes()


def launch(conn: socket.socket, module: str, argv: Sequence[str]) -> NoReturn:
    """The launcher: have the preloader fork the server, stand in for it until it exits."""
    gone_r, gone_w = os.pipe()  # gone_w is held here only: its end-of-file says we are gone
    request = {"module": module, "argv": list(argv), "env": dict(os.environ), "cwd": os.getcwd()}
    socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2, gone_r])
    os.close(gone_r)
    pid = int(conn.recv(64))

    def forward(signum: int, _: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    code = int(conn.recv(64) or b"1")  # nothing: the preloader is gone, and so is the server
    sys.exit(128 - code if code < 0 else code)


def main(argv: Sequence[str]) -> None:
    role, rest = (argv[0], argv[1:]) if argv else ("", [])
    if role == "preloader" and rest:
        preload(rest[0], rest[1:])
    if role != "launch" or not rest:
        sys.exit(f"usage: python -m {MODULE} preloader SOCKET [MODULE ...] | launch MODULE [ARGS]")
    module, args = rest[0], rest[1:]
    # Not passed on: the server's environment is the launcher's, less the socket.
    if (path := os.environ.pop(PRELOADER_ENV, None)) and (conn := connect(path)):
        launch(conn, module, args)
    if path:
        print(f"the job's preloader ({path}) can't be reached: {module} starts here",
              file=sys.stderr, flush=True)
    sys.exit(run(module, args))


if __name__ == "__main__":
    main(sys.argv[1:])
