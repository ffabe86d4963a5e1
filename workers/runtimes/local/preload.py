"""vLLM imported once per job: a preloader forks each of the job's vLLM servers on the CPU.

A job of the local runtime starts up to four vLLM servers (hidden states, then the evaluation's
engines) and each one's start is mostly the API server's imports: about 13 of 22 s on 2 cores
(docs/ci.md, ``benchmarks/vllm_preload.py``). Here those imports are paid once per job:

- **preloader** (``python -m workers.runtimes.local.preload SOCKET``): started by the job
  (workers/runner.py) with the job's environment, in a session of its own like every process a
  job starts; imports vLLM's API server (with serve.py's forked engine core) and then, for each
  launcher that connects to its Unix socket, forks a **server**. The servers stay in its process
  group and inherit its environment block, so what finds a job's processes (the job's id in
  ``/proc/PID/environ``, the recorded groups) finds them. It is a child subreaper: an engine core
  whose server died is handed to it, and it kills it.
- **server** (the preloader's child): takes the launcher's stdio, working directory and
  environment, then runs vLLM's module as serve.py does. It dies, engine core included, when its
  launcher's pipe reaches end-of-file: when the launcher is gone, however it died.
- **launcher**: ``python -m workers.runtimes.local.serve ARGS`` as before, with ``PRELOADER_ENV``
  naming the socket. It hands over its argv, environment, cwd and stdio, forwards SIGTERM and
  SIGINT to the server and exits with its status, so the worker supervises it exactly as it
  supervised vLLM itself. With no preloader to reach, it runs vLLM itself.

The socket lives in a directory only the job's user can enter (0700): whoever connects can start
a process as that user.
"""

from __future__ import annotations

import contextlib
import ctypes
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
from typing import NoReturn

from app.supervise import descendants, live_processes

PRELOADER_ENV = "SPECDECK_VLLM_PRELOADER"  # the preloader's socket, in a launcher's environment
MODULE = "workers.runtimes.local.preload"
READY_TIMEOUT = 120.0  # how long a launcher waits for the preloader's imports
PR_SET_CHILD_SUBREAPER = 36


def preloader_argv(path: str, module: str | None = None) -> list[str]:
    """The preloader's command; its servers run ``module`` (default: vLLM's API server)."""
    return [sys.executable, "-m", MODULE, path, *([module] if module else [])]


def preload(path: str, module: str | None = None) -> NoReturn:
    """The preloader: import the servers' module once (vLLM's API server, with serve.py's
    forked engine core), then fork a server per launcher."""
    began = time.monotonic()
    with open(path + ".pid", "w") as pid_file:  # a launcher stops waiting once this pid is gone
        pid_file.write(str(os.getpid()))
    if module is None:
        from workers.runtimes.local.serve import API_SERVER, fork_the_engine_core

        fork_the_engine_core()
        module = API_SERVER
    importlib.import_module(module)
    with contextlib.suppress(OSError, AttributeError):  # not Linux: orphans go to init
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + ".tmp")
    listener.listen(16)
    os.rename(path + ".tmp", path)  # connectable once it exists
    print(f"{module} preloaded in {time.monotonic() - began:.1f} s; its servers fork from here",
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
                serve(json.loads(message), fds, module)
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


def serve(request: dict, fds: list[int], module: str) -> NoReturn:
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
    threading.Thread(target=die_with_the_launcher, args=(launcher_gone,), daemon=True).start()
    sys.argv = [module, *request["argv"]]
    sys.modules.pop(module, None)  # run afresh as __main__ (its imports are what was preloaded)
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


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


def launch(conn: socket.socket, argv: list[str]) -> NoReturn:
    """The launcher: have the preloader fork the server, stand in for it until it exits."""
    gone_r, gone_w = os.pipe()  # gone_w is held here only: its end-of-file says we are gone
    env = {k: v for k, v in os.environ.items() if k != PRELOADER_ENV}
    request = {"argv": argv, "env": env, "cwd": os.getcwd()}
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


if __name__ == "__main__":
    preload(*sys.argv[1:3])
