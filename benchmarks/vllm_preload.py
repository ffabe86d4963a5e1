"""A design for issue 20, measured here and not used by the product yet: vLLM's API server
forked from a preloader that imported it once, behind a thin launcher that keeps what the worker
and the tests see of today's server process (docs/ci.md, "The next lever").

    .venv/bin/python benchmarks/vllm_preload.py                # the demo verifier, 3 rounds
    .venv/bin/python benchmarks/vllm_preload.py --model DIR --rounds 5

Side by side in one run, interleaved: the worker's command today (a fresh Python importing vLLM,
``python -m workers.runtimes.local.serve ARGS``), and the same arguments given to the launcher
(this script with ``--launch``), which hands its argv, environment, working directory and stdio
to a warm preloader (``--preloader``); each timed from spawn to /health 200 and to the first
hidden-states file, as benchmarks/vllm_start.py does. Then the checks the design rests on, each
printed with its result: the launcher's command line and environment are the job's, it exits
with the server's status on SIGTERM, and a SIGKILL of its group takes the server and its engine
core with it.

The roles:
- **preloader**: imports vLLM's API server (the engine core forked, as serve.py does), then for
  each launcher on its Unix socket forks a server and reports the server's pid and, when it
  ends, its exit status. One thread: it forks from a loop on ``select``, no lock held elsewhere.
- **server** (the preloader's child): a session of its own, the launcher's stdio, cwd and
  environment, then vLLM's module as ``runpy`` runs it; it kills its own process group when the
  launcher's pipe reaches end-of-file, i.e. when the launcher is gone, however it died.
- **launcher**: what the worker would start; forwards SIGTERM and SIGINT to the server and exits
  with its status.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import runpy
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.runtimes.vllm import CPU_ENV, CPU_SERVER_MODULE  # noqa: E402
from app.supervise import live_processes  # noqa: E402
from benchmarks._stack import free_port, load, machine, ratio, table  # noqa: E402
from benchmarks.vllm_start import demo_model, server_argv, time_server  # noqa: E402

MARKER = "SPECDECK_PRELOAD_BENCH"  # in the launcher's environment: must show in /proc/PID/environ


# --- the preloader and its servers ------------------------------------------------------------

def preloader(path: str) -> None:
    import importlib

    from workers.runtimes.local.serve import API_SERVER, fork_the_engine_core

    fork_the_engine_core()
    importlib.import_module(API_SERVER)  # what every start pays today, paid once
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + ".tmp")
    listener.listen(16)
    os.rename(path + ".tmp", path)  # connectable once it exists
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    launchers: dict[int, socket.socket] = {}  # server pid -> its launcher's connection
    while True:
        ready, _, _ = select.select([listener, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
            while launchers:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                if (conn := launchers.pop(pid, None)) is not None:
                    with contextlib.suppress(OSError):  # a launcher that was killed
                        conn.send(str(os.waitstatus_to_exitcode(status)).encode())
                    conn.close()
        if listener in ready:
            conn, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 4)
            pid = os.fork()
            if pid == 0:
                for other in (listener, conn, *launchers.values()):
                    other.close()
                for fd in (wake_r, wake_w):
                    os.close(fd)
                serve(json.loads(message), fds, API_SERVER)
            for fd in fds:
                os.close(fd)
            conn.send(str(pid).encode())
            launchers[pid] = conn


def serve(request: dict, fds: list[int], module: str) -> None:
    """In the forked child: become the launcher's server; never returns."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    stdin, stdout, stderr, launcher_gone = fds
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])

    def die_with_the_launcher() -> None:
        while os.read(launcher_gone, 1):
            pass
        os.killpg(0, signal.SIGKILL)  # the server and its engine core

    threading.Thread(target=die_with_the_launcher, daemon=True).start()
    sys.argv = [module, *request["argv"]]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def launch(path: str, argv: list[str]) -> None:
    gone_r, gone_w = os.pipe()  # gone_w is held here only: its end-of-file says we are gone
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    conn.connect(path)
    request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}
    socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2, gone_r])
    os.close(gone_r)
    pid = int(conn.recv(64))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _: os.kill(pid, signum))
    code = int(conn.recv(64) or b"1")
    sys.exit(128 - code if code < 0 else code)


# --- the benchmark ------------------------------------------------------------------------------

def children_of(pid: int) -> list[int]:
    return [child for child, (parent, _) in live_processes().items() if parent == pid]


def alive(pid: int) -> bool:
    return pid in live_processes()


def wait_gone(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.02)
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a verifier directory (default: the demo's)")
    parser.add_argument("--layers", type=int, default=12, help="its number of hidden layers")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--preloader", metavar="SOCKET", help=argparse.SUPPRESS)
    parser.add_argument("--launch", metavar="SOCKET", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.preloader:
        return preloader(args.preloader)
    if args.launch:
        return launch(args.launch, rest[1:] if rest[:1] == ["--"] else rest)

    with tempfile.TemporaryDirectory(prefix="specdeck-vllm-preload-") as tmp:
        work = Path(tmp)
        model = args.model or demo_model(work)
        env = {**os.environ, **CPU_ENV}
        sock = str(work / "preloader.sock")
        began = time.perf_counter()
        pre = subprocess.Popen([sys.executable, __file__, "--preloader", sock], env=env,
                               stdout=(work / "preloader.log").open("w"),
                               stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while not Path(sock).exists():
                if pre.poll() is not None:
                    raise SystemExit(f"the preloader exited with {pre.returncode}")
                time.sleep(0.05)
            preloaded = time.perf_counter() - began

            def launcher_argv(port: int) -> list[str]:
                argv = server_argv(model, args.layers, work, port)
                return [sys.executable, __file__, "--launch", sock, "--",
                        *argv[argv.index(CPU_SERVER_MODULE) + 1:]]

            variants = {"worker's command today (fresh Python)":
                        lambda port: server_argv(model, args.layers, work, port),
                        "launcher, forked by the warm preloader": launcher_argv}
            times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
            for _ in range(args.rounds):  # interleaved, so a busy moment hits both alike
                for name, argv_for in variants.items():
                    port = free_port()
                    times[name].append(time_server(argv_for(port), env, model, work, port))
            checks = check_the_design(launcher_argv, env, model, work, pre.pid)
        finally:
            os.killpg(pre.pid, signal.SIGTERM)
            pre.wait(30)
        medians = {name: statistics.median(r[0] for r in rows) for name, rows in times.items()}
        print(f"{machine()}, load {load():.2f}; the preloader was ready {preloaded:.1f} s "
              "after its spawn (its imports, once)\n")
        print(table(["variant", f"healthy after (median of {args.rounds})", "each",
                     "first hidden-states file after"],
                    [[name, f"{medians[name]:.1f} s", ", ".join(f"{r[0]:.1f}" for r in rows),
                      f"{statistics.median(r[1] for r in rows):.2f} s"]
                     for name, rows in times.items()]))
        today, forked = medians.values()
        print(f"\nforked from the preloader, a server is healthy in {ratio(forked, today)} the "
              f"time of today's command ({today - forked:.1f} s less per start)\n")
        for name, passed in checks.items():
            print(f"{'PASS' if passed else 'FAIL'}  {name}")


def check_the_design(launcher_argv, env: dict[str, str], model: Path, work: Path,
                     preloader_pid: int) -> dict[str, bool]:
    checks: dict[str, bool] = {}
    found: dict[str, int] = {}

    def sigterm(proc: subprocess.Popen[bytes]) -> None:
        [server] = children_of(preloader_pid)
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        checks["the launcher's /proc cmdline carries the server's arguments"] = (
            b"--model" in cmdline and str(model).encode() in cmdline)
        checks["the launcher's /proc environ carries the job's variables"] = (
            f"{MARKER}=1".encode() in environ)
        os.killpg(proc.pid, signal.SIGTERM)
        code = proc.wait(60)
        checks[f"SIGTERM to the launcher's group: the server stops, and the launcher exits after "
               f"it, with its status ({code})"] = not alive(server)

    def sigkill(proc: subprocess.Popen[bytes]) -> None:
        [server] = children_of(preloader_pid)
        found["engine cores"] = len(engine := children_of(server))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        checks[f"SIGKILL to the launcher's group: the server and its {len(engine)} engine core(s)"
               " are gone within 5 s"] = bool(engine) and wait_gone([server, *engine], 5)

    for keep in (sigterm, sigkill):
        port = free_port()
        time_server(launcher_argv(port), {**env, MARKER: "1"}, model, work, port, keep=keep)
    return checks


if __name__ == "__main__":
    main()
