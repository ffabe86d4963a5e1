"""`specdeck doctor`: run every check for a runtime, print the rows, exit with what they say.

Exit codes:
  0  every check the runtime needs passed (rows that only warn, or that do not apply on this
     host, do not count);
  1  something the runtime needs is missing or failing (a check that crashed counts too);
  2  a usage error, as for every specdeck command.

The checks are providers, ``module:function`` with ``function(runtime) -> list[Check]``, each in
its own module under app/doctor/. A worker runs them at start-up and logs what fails; the
compose healthcheck of a worker runs the command."""

from __future__ import annotations

import importlib
import json
import logging
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict
from typing import Any

from app.doctor.report import Check

log = logging.getLogger(__name__)

Provider = Callable[[str], list[Check]]
RUNTIMES = ("local", "vllm")
PROVIDERS = (
    "app.doctor.versions:version_checks",
    "app.doctor.gpus:gpu_checks",
    "app.doctor.flags:flag_checks",
    "app.doctor.disk:disk_checks",
    "app.doctor.services:service_checks",
    "app.doctor.services:hub_checks",
)
# At a worker's start-up: the same less the Hub, which may take seconds not to answer.
STARTUP_PROVIDERS = tuple(p for p in PROVIDERS if p != "app.doctor.services:hub_checks")
SUCCEEDED, FAILED = 0, 1


def host_runtime(gpus: list[Any]) -> str:
    """The runtime a worker with these GPUs serves: vllm with GPUs, else local."""
    return "vllm" if gpus else "local"


def load(path: str) -> Provider:
    module, _, function = path.partition(":")
    return getattr(importlib.import_module(module), function)


def collect(runtime: str, providers: Iterable[str | Provider]) -> list[Check]:
    """Every provider's rows. A provider that cannot be imported or that raises is a failed
    row of its own: the doctor never hides the other checks behind one broken check."""
    rows: list[Check] = []
    for provider in providers:
        name = provider if isinstance(provider, str) else provider.__name__
        try:
            rows.extend((load(provider) if isinstance(provider, str) else provider)(runtime))
        except Exception as exc:  # reported as the failure it is
            rows.append(Check("doctor", name, False, f"the check could not run: "
                              f"{type(exc).__name__}: {exc}"))
    return rows


def failures(rows: Iterable[Check]) -> list[Check]:
    return [row for row in rows if row.required and row.ok is False]


def status(row: Check) -> str:
    if row.ok is None:
        return "-"
    if row.ok:
        return "ok"
    return "FAIL" if row.required else "warn"


def report(runtime: str, rows: list[Check]) -> dict[str, Any]:
    """The --json document."""
    failed = failures(rows)
    return {"runtime": runtime, "ok": not failed, "exit_code": FAILED if failed else SUCCEEDED,
            "checks": [{**asdict(row), "status": status(row)} for row in rows]}


def render(runtime: str, rows: list[Check]) -> None:
    """A rich table on a terminal, plain aligned columns otherwise (logs, pipes, CI)."""
    failed = failures(rows)
    summary = (f"{len(failed)} check(s) the {runtime} runtime needs failed" if failed
               else f"the {runtime} runtime has what it needs")
    if not sys.stdout.isatty():
        from app.client.output import table

        print(table(({"status": status(r), "group": r.group, "check": r.name, "detail": r.detail}
                     for r in rows), ("status", "group", "check", "detail")))
        print(summary, flush=True)
        return
    from rich.console import Console
    from rich.table import Table

    colors = {"ok": "green", "FAIL": "bold red", "warn": "yellow", "-": "dim"}
    grid = Table(title=f"specdeck doctor --runtime {runtime}")
    for column in ("status", "group", "check", "detail"):
        grid.add_column(column, overflow="fold")
    for row in rows:
        grid.add_row(f"[{colors[status(row)]}]{status(row)}[/]", row.group, row.name, row.detail)
    console = Console()
    console.print(grid)
    console.print(f"[{'bold red' if failed else 'green'}]{summary}[/]")


def run(runtime: str, *, as_json: bool, offline: bool = False) -> int:
    rows = collect(runtime, STARTUP_PROVIDERS if offline else PROVIDERS)
    if as_json:
        from app.client.output import emit_json

        emit_json(report(runtime, rows))
    else:
        render(runtime, rows)
    return FAILED if failures(rows) else SUCCEEDED


def warn_at_startup(runtime: str) -> None:
    """A worker's start-up: the checks (less the Hub), one warning for what fails. They run in
    a process of their own (``specdeck doctor --offline --json``): they import vLLM and the
    trainer, whose imports have no business in a worker that runs jobs on other threads
    meanwhile."""
    done = subprocess.run([sys.executable, "-m", "app.cli", "doctor", "--runtime", runtime,
                           "--offline", "--json"], capture_output=True, text=True, check=False)
    try:
        checks = json.loads(done.stdout)["checks"]
    except (ValueError, KeyError, TypeError):
        log.warning("specdeck doctor could not run (exit code %s): %s", done.returncode,
                    done.stderr.strip()[-2000:])
        return
    failed = [c for c in checks if c["status"] == "FAIL"]
    if failed:
        log.warning("specdeck doctor: this worker lacks what the %s runtime needs: %s", runtime,
                    "; ".join(f"{c['group']} {c['name']}: {c['detail']}" for c in failed))
    else:
        log.info("specdeck doctor: this worker has what the %s runtime needs", runtime)
