"""`specdeck doctor` as an operator runs it, on this machine (no GPU, no vLLM), against the
real Postgres and Redis: the exit code for each runtime, the services row, the --json shape,
the table on a terminal, and the warning a worker logs at start-up."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import time
from typing import Any

from tests.conftest import REDIS_URL, ROOT, SPECDECK, Stack

# The Hub endpoint a closed local port: the check answers at once, and the same way everywhere.
NO_HUB = "http://127.0.0.1:9"


def doctor(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SPECDECK, "doctor", *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT),
                                         "SPECDECK_HF_ENDPOINT": NO_HUB, **env})


def environment(pg_url: str, roots: dict[str, str]) -> dict[str, str]:
    return {"SPECDECK_DATABASE_URL": pg_url, "SPECDECK_BROKER_URL": REDIS_URL, **roots}


def rows(result: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    document = json.loads(result.stdout)
    return {f"{c['group']}/{c['name']}": c for c in document["checks"]}


def test_the_local_runtime_has_what_it_needs_here(pg_url: str, roots: dict[str, str]) -> None:
    result = doctor(environment(pg_url, roots), "--runtime", "local")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["status", "group", "check", "detail"]  # plain: not a terminal
    (gpus,) = [line for line in lines if line.split()[1:3] == ["gpus", "GPUs"]]
    assert gpus.split()[0] == "-" and "no GPU" in gpus
    assert lines[-1] == "the local runtime has what it needs"


def test_the_vllm_runtime_lacks_a_gpu_and_vllm_here(pg_url: str, roots: dict[str, str]) -> None:
    result = doctor(environment(pg_url, roots), "--runtime", "vllm", "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    found = rows(result)
    assert found["versions/vllm"]["status"] == "FAIL"
    assert found["versions/vllm"]["detail"].startswith("not installed (wants ==0.33.")
    assert found["gpus/GPUs"]["status"] == "FAIL" and "no GPU" in found["gpus/GPUs"]["detail"]
    assert found["services/database"]["ok"] and found["services/broker"]["ok"]
    # The vllm runtime needs the Hub; the closed port is a failure there.
    assert found["services/Hub"]["status"] == "FAIL"


def test_an_unreachable_database_fails_the_services_row(roots: dict[str, str]) -> None:
    env = environment("postgresql+psycopg://specdeck:secret@127.0.0.1:1/specdeck", roots)
    result = doctor(env, "--runtime", "local", "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    database = rows(result)["services/database"]
    assert database["status"] == "FAIL" and database["required"] is True
    assert database["detail"].startswith("postgresql+psycopg://specdeck:***@127.0.0.1:1/specdeck: ")
    assert "secret" not in result.stdout


def test_json_shape(pg_url: str, roots: dict[str, str]) -> None:
    result = doctor(environment(pg_url, roots), "--runtime", "local", "--json")
    document = json.loads(result.stdout)
    assert set(document) == {"runtime", "ok", "exit_code", "checks"}
    assert (document["runtime"], document["ok"], document["exit_code"]) == ("local", True, 0)
    assert {c["group"] for c in document["checks"]} >= {"versions", "gpus", "disk", "services"}
    for check in document["checks"]:
        assert set(check) == {"group", "name", "ok", "required", "detail", "status"}
        assert check["status"] in {"ok", "FAIL", "warn", "-"}


def test_a_terminal_gets_a_table(pg_url: str, roots: dict[str, str]) -> None:
    """Under a pseudo-terminal stdout is a TTY: rich draws the table."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPECDECK_HF_ENDPOINT": NO_HUB,
           "COLUMNS": "200", **environment(pg_url, roots)}
    controller, terminal = pty.openpty()
    proc = subprocess.Popen([SPECDECK, "doctor", "--runtime", "vllm"], stdout=terminal,
                            stderr=terminal, cwd=ROOT, env=env)
    os.close(terminal)
    output = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the terminal closed: the doctor exited
            break
        if not chunk:
            break
        output += chunk
    os.close(controller)
    assert proc.wait(timeout=60) == 1
    text = output.decode()
    assert "specdeck doctor --runtime vllm" in text and "┃" in text
    assert "failed" in text


def test_a_worker_warns_at_start_up_about_what_its_runtime_lacks(pg_stack: Stack) -> None:
    """A worker offered a GPU (SPECDECK_WORKER_GPUS) serves the vllm runtime; there is no vLLM
    here, and the doctor it runs at start-up says so in its log."""
    worker = pg_stack.start_worker(SPECDECK_WORKER_GPUS="0")
    deadline = time.monotonic() + 60
    while "specdeck doctor:" not in worker.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    (line,) = [l for l in worker.log.read_text().splitlines() if "specdeck doctor:" in l]
    assert "WARNING" in line
    assert "lacks what the vllm runtime needs" in line and "versions vllm: not installed" in line
