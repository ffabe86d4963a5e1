"""What the job's preloader saves on vLLM's starts (workers/runtimes/local/preload.py): vLLM's API
server forked from a preloader that imported it once, behind a thin launcher that keeps what the
worker and the tests see of a server process (docs/ci.md).

    .venv/bin/python benchmarks/vllm_preload.py                # the demo verifier, 3 rounds
    .venv/bin/python benchmarks/vllm_preload.py --model DIR --rounds 5

Side by side in one run, interleaved: the worker's command (``python -m
workers.runtimes.local.serve ARGS``) without a preloader (a fresh Python importing vLLM), and the
launcher the worker starts in its place when the job has a warm preloader (``launcher_argv``,
``SPECDECK_VLLM_PRELOADER`` naming its socket), as a job's servers after its first get it; and
the same launcher forked by a preloader whose ``gc.freeze()`` is made a no-op (the benchmark's own
patch, before the preloader's module runs). Each is timed from spawn to /health 200 and to the
first hidden-states file, as benchmarks/vllm_start.py does, with the CPU seconds (user + system)
of the server's processes by then. Then the checks the design rests on, each
printed with its result: the launcher's command line and environment are the job's, it exits
with the server's status on SIGTERM, and a SIGKILL of its group takes the server and its engine
core with it.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.runtimes.vllm import CPU_ENV  # noqa: E402
from app.supervise import live_processes  # noqa: E402
from benchmarks._stack import free_port, load, machine, ratio, table  # noqa: E402
from benchmarks.vllm_start import demo_model, server_argv, session_cpu, time_server  # noqa: E402
from workers.runtimes.local.preload import (MODULE, PRELOADER_ENV, launcher_argv,  # noqa: E402
                                            preloader_argv)

MARKER = "SPECDECK_PRELOAD_BENCH"  # in the launcher's environment: must show in /proc/PID/environ


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


def unfrozen_preloader_argv(path: str) -> list[str]:
    """The preloader's command with ``gc.freeze`` a no-op: what a forked server costs without it."""
    patch = (f"import gc, runpy, sys; gc.freeze = lambda: None; "
             f"sys.argv = ['{MODULE}', 'preloader', {path!r}]; "
             f"runpy.run_module('{MODULE}', run_name='__main__', alter_sys=True)")
    return [sys.executable, "-c", patch]


def start_preloader(argv: list[str], env: dict[str, str], log: Path, sock: str
                    ) -> tuple[subprocess.Popen[bytes], float]:
    """A preloader, and the seconds until its socket exists (its imports, once)."""
    began = time.perf_counter()
    pre = subprocess.Popen(argv, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                           start_new_session=True)
    while not Path(sock).exists():
        if pre.poll() is not None:
            raise SystemExit(f"the preloader exited with {pre.returncode}: see {log}")
        time.sleep(0.05)
    return pre, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a verifier directory (default: the demo's)")
    parser.add_argument("--layers", type=int, default=12, help="its number of hidden layers")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="specdeck-vllm-preload-") as tmp:
        work = Path(tmp)
        model = args.model or demo_model(work)
        env = {**os.environ, **CPU_ENV}
        sock, unfrozen_sock = str(work / "preloader.sock"), str(work / "unfrozen.sock")
        pre, preloaded = start_preloader(preloader_argv(sock), env, work / "preloader.log", sock)
        unfrozen, _ = start_preloader(unfrozen_preloader_argv(unfrozen_sock), env,
                                      work / "unfrozen.log", unfrozen_sock)
        try:
            def argv_for(port: int) -> list[str]:
                return server_argv(model, args.layers, work, port)

            def launched(port: int) -> list[str]:
                return launcher_argv(argv_for(port))

            forked = {**env, PRELOADER_ENV: sock}
            # name: (its command, its environment, the session its server's processes are in)
            variants = {"no preloader (a fresh Python imports vLLM)": (argv_for, env, None),
                        "launcher, forked by the warm preloader": (launched, forked, pre.pid),
                        "the same, the preloader without gc.freeze()":
                            (launched, {**env, PRELOADER_ENV: unfrozen_sock}, unfrozen.pid)}
            times: dict[str, list[tuple[float, ...]]] = {name: [] for name in variants}
            for _ in range(args.rounds):  # interleaved, so a busy moment hits all alike
                for name, (argv_of, variant_env, session) in variants.items():
                    port = free_port()
                    before = session_cpu(session) if session else (0.0, 0.0)
                    cpu: list[float] = []

                    def by_then(proc: subprocess.Popen[bytes], session=session, before=before,
                                cpu=cpu) -> None:
                        now = session_cpu(session or proc.pid)
                        cpu.append(now[0] + now[1] - before[0] - before[1])

                    timings = time_server(argv_of(port), variant_env, model, work, port,
                                          keep=by_then)
                    times[name].append((*timings, *cpu))
            checks = check_the_design(launched, forked, model, work, pre.pid)
        finally:
            for preloader in (pre, unfrozen):
                os.killpg(preloader.pid, signal.SIGTERM)
                preloader.wait(30)
        medians = {name: statistics.median(r[0] for r in rows) for name, rows in times.items()}
        cpu_medians = {name: statistics.median(r[2] for r in rows) for name, rows in times.items()}
        print(f"{machine()}, load {load():.2f}; the preloader was ready {preloaded:.1f} s "
              "after its spawn (its imports, once)\n")
        print(table(["variant", f"healthy after (median of {args.rounds})", "each",
                     "first hidden-states file after", "CPU by then"],
                    [[name, f"{medians[name]:.1f} s", ", ".join(f"{r[0]:.1f}" for r in rows),
                      f"{statistics.median(r[1] for r in rows):.2f} s",
                      f"{cpu_medians[name]:.1f} s"]
                     for name, rows in times.items()]))
        today, forked_start, unfrozen_start = medians.values()
        fresh_cpu, forked_cpu, unfrozen_cpu = cpu_medians.values()
        print(f"\nforked from the preloader, a server is healthy in {ratio(forked_start, today)} "
              f"the time of today's command ({today - forked_start:.1f} s less per start), with "
              f"{ratio(forked_cpu, fresh_cpu)} its CPU; gc.freeze() in the preloader: "
              f"{ratio(forked_start, unfrozen_start)} the start and "
              f"{ratio(forked_cpu, unfrozen_cpu)} the CPU of a preloader without it\n")
        for name, passed in checks.items():
            print(f"{'PASS' if passed else 'FAIL'}  {name}")


def check_the_design(argv_for, env: dict[str, str], model: Path, work: Path,
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
        time_server(argv_for(port), {**env, MARKER: "1"}, model, work, port, keep=keep)
    return checks


if __name__ == "__main__":
    main()
