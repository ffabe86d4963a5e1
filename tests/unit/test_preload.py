"""The job's preloader (workers/runtimes/local/preload.py), with a double of vLLM's API server
(tests/support/forked_server.py) so that each start takes milliseconds: real processes, a real
Unix socket, real signals, the real launcher (``python -m workers.runtimes.local.preload launch
MODULE ARGS``). The launcher is what the worker starts and supervises; the server it stands in
for must act on what it was given and never outlive it."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support.waiting import wait_for
from workers.runtimes.local.preload import (PRELOADER_ENV, connect, forks, launcher_argv,
                                            preloader_argv)

DOUBLE = "tests.support.forked_server"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def preloader(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    path = str(tmp_path / "preloader.sock")
    proc = subprocess.Popen(preloader_argv(path, DOUBLE), cwd=ROOT,
                            env={**os.environ, "JOB_MARK": "job-1", "PYTHONPATH": str(ROOT)},
                            start_new_session=True)
    wait_for(lambda: os.path.exists(path), 30, "the preloader's socket")
    yield path, proc
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def launcher(path: str | None, *argv: str, cwd: Path, env: dict[str, str] | None = None,
             stderr: int | None = None) -> subprocess.Popen[str]:
    """What the worker starts for ``python -m DOUBLE ARGS`` when the job has a preloader at
    ``path`` (None: none)."""
    preloader = {PRELOADER_ENV: path} if path else {}
    return subprocess.Popen(launcher_argv([sys.executable, "-m", DOUBLE, *argv]), cwd=cwd,
                            text=True, stdout=subprocess.PIPE, stderr=stderr,
                            start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **preloader, **(env or {})})


def started(proc: subprocess.Popen[str]) -> dict[str, str]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    return dict(re.findall(r"(\w+)=(\[.*?\]|\S+)", line))


def gone(*pids: int) -> bool:
    return not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in pids)


def test_the_server_gets_the_launchers_argv_cwd_environment_and_stdout(preloader, tmp_path):
    path, pre = preloader
    proc = launcher(path, "--show-env", "ONLY_THE_LAUNCHER", cwd=tmp_path,
                    env={"ONLY_THE_LAUNCHER": "yes"})
    seen = started(proc)
    assert seen["argv"] == "['--show-env', 'ONLY_THE_LAUNCHER']"
    assert seen["cwd"] == str(tmp_path) and seen["env"] == "yes"
    server = psutil.Process(int(seen["server"]))
    assert server.ppid() == pre.pid  # forked by the preloader, not started afresh
    # Its /proc environ is the preloader's, so the job's marker finds it (workers/supervisor.py)
    assert server.environ()["JOB_MARK"] == "job-1"
    proc.terminate()
    assert proc.wait(10) == 3


def test_a_server_that_exits_gives_its_status_to_the_launcher(preloader, tmp_path):
    path, _ = preloader
    proc = launcher(path, "--exit", "5", cwd=tmp_path)
    assert proc.wait(10) == 5


def test_a_server_whose_module_raises_exits_1_with_its_traceback(preloader, tmp_path):
    path, pre = preloader
    proc = launcher(path, "--raise", cwd=tmp_path, stderr=subprocess.PIPE)
    _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 1 and "RuntimeError: the double raised" in stderr
    assert pre.poll() is None  # the preloader serves the job's next launcher
    assert launcher(path, "--exit", "0", cwd=tmp_path).wait(10) == 0


def test_sigterm_reaches_the_server_and_the_launcher_exits_after_it(preloader, tmp_path):
    path, _ = preloader
    proc = launcher(path, cwd=tmp_path)
    seen = started(proc)
    os.killpg(proc.pid, signal.SIGTERM)  # what the worker's stop sends: the launcher's group
    assert proc.wait(10) == 3  # the server's SIGTERM handler ran and chose the status
    assert wait_for(lambda: gone(int(seen["server"]), int(seen["engine"])), 10, "the server")


def test_a_killed_launcher_takes_its_server_and_engine_core_with_it(preloader, tmp_path):
    path, pre = preloader
    proc = launcher(path, cwd=tmp_path)
    seen = started(proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    wait_for(lambda: gone(int(seen["server"]), int(seen["engine"])), 10, "server and engine")
    assert pre.poll() is None  # the preloader serves the job's next launcher
    again = launcher(path, "--exit", "0", cwd=tmp_path)
    assert again.wait(10) == 0


def test_a_killed_servers_engine_core_is_killed_and_its_launcher_exits(preloader, tmp_path):
    path, _ = preloader
    proc = launcher(path, cwd=tmp_path)
    seen = started(proc)
    os.kill(int(seen["server"]), signal.SIGKILL)
    assert proc.wait(10) == 128 + signal.SIGKILL
    # The orphaned engine core went to the preloader (a child subreaper), which killed it.
    assert wait_for(lambda: gone(int(seen["engine"])), 10, "the engine core")


def test_two_launchers_at_once_get_servers_of_their_own(preloader, tmp_path):
    path, _ = preloader
    first, second = launcher(path, cwd=tmp_path), launcher(path, cwd=tmp_path)
    servers = {started(first)["server"], started(second)["server"]}
    assert len(servers) == 2
    for proc in (first, second):
        proc.terminate()
        assert proc.wait(10) == 3


def test_a_preloader_that_is_not_there_is_not_waited_for(tmp_path):
    assert connect(str(tmp_path / "gone" / "preloader.sock")) is None
    assert connect(str(tmp_path / "preloader.sock"), timeout=0.2) is None


def test_a_preloader_that_died_before_listening_is_not_waited_for(tmp_path):
    path = str(tmp_path / "preloader.sock")
    # Its module can't be imported: it wrote its pid and exited without a socket.
    dead = subprocess.run(preloader_argv(path, "no.such.module"), cwd=ROOT, capture_output=True)
    assert dead.returncode != 0 and os.path.exists(path + ".pid")
    # No deadline to run into: only seeing the preloader gone ends the wait.
    assert connect(path, timeout=math.inf) is None


def test_the_launcher_does_not_pass_the_socket_on(preloader, tmp_path):
    path, _ = preloader
    proc = launcher(path, "--show-env", PRELOADER_ENV, cwd=tmp_path)
    assert started(proc)["env"] == "None"
    proc.terminate()
    proc.wait(10)


def test_with_no_preloader_to_reach_the_launcher_runs_the_module_itself(tmp_path):
    gone = str(tmp_path / "gone" / "preloader.sock")
    for path in (None, gone):
        proc = launcher(path, "--show-env", "ONLY_THE_LAUNCHER", cwd=tmp_path,
                        env={"ONLY_THE_LAUNCHER": "yes"})
        seen = started(proc)
        assert seen["server"] == str(proc.pid) and seen["env"] == "yes"
        assert seen["argv"] == "['--show-env', 'ONLY_THE_LAUNCHER']"
        proc.terminate()
        assert proc.wait(10) == 3


def test_a_server_uses_the_openmp_threads_its_own_environment_asks_for(tmp_path):
    """OpenMP read the preloader's OMP_NUM_THREADS when torch was imported there: a server whose
    environment asks for another count (the trainer's) gets it."""
    path = str(tmp_path / "preloader.sock")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "3"}
    pre = subprocess.Popen(preloader_argv(path, DOUBLE, "torch"), cwd=ROOT, env=env,
                           start_new_session=True)
    try:
        wait_for(lambda: os.path.exists(path), 120, "the preloader's socket")
        for threads in ("1", "2"):
            proc = launcher(path, "--show-env", "OMP_NUM_THREADS", "--show-torch-threads",
                            cwd=tmp_path, env={"OMP_NUM_THREADS": threads})
            seen = started(proc)
            assert (seen["env"], seen["torch_threads"]) == (threads, threads)
            proc.terminate()
            assert proc.wait(10) == 3
    finally:
        os.killpg(pre.pid, signal.SIGKILL)
        pre.wait(10)

def test_a_local_jobs_python_processes_fork_and_nothing_else_does() -> None:
    """vLLM's servers, prepare-data and the single-process trainer of the local runtime's plan
    are forked; torchrun (its workers are its own children) and the GPU runtime's commands are
    not (a job preloads on the local runtime only: workers/runner.py)."""
    from app.runtimes import ServeSpec, build_plan
    from app.runtimes.local import serve_command
    from app.schemas.job_spec import JobSpec
    from tests.unit.test_runtimes import PATHS, spec

    def local(trainer_gpus: int) -> JobSpec:
        return spec(runtime="local", resources={"trainer_gpus": trainer_gpus, "verifier": {
            "tensor_parallel_size": 1, "data_parallel_size": 1}})

    # The hidden-states server, prepare-data, the trainer and the evaluation's three engines.
    plan = build_plan(local(1), PATHS, port=7)
    assert len(plan.stages) == 6 and all(forks(stage.argv) for stage in plan.stages)
    assert not forks(build_plan(local(2), PATHS, port=7).stage("training").argv)  # torchrun
    assert not forks(build_plan(spec(), PATHS, port=7).stage("starting_verifier").argv)  # vllm serve
    served = serve_command(ServeSpec(verifier="demo", method="ngram", num_speculative_tokens=7,
                                     runtime="local"), "d", port=1, host="127.0.0.1", gpus=[],
                           api_key="k")
    launched = launcher_argv(served.argv)
    assert forks(served.argv) and launched[:5] == [
        sys.executable, "-m", "workers.runtimes.local.preload", "launch",
        "workers.runtimes.local.serve"] and launched[5:] == served.argv[3:]
