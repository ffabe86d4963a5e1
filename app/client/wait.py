"""Following a job (or a deployment, or a promotion) until it ends: progress on stderr, a
one-line summary, and the exit code its outcome means.

A job is polled (``GET /api/jobs/{id}`` every POLL_SECONDS, its new events, and now and then its
latest ``train/loss``): every request goes through the client's retries, so a restarting server
or a network blip only delays the next line. On a terminal the progress is a live bar (rich);
elsewhere (CI logs) plain timestamped lines.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from app.client import exits
from app.client.exits import CLIError
from app.client.http import Api
from app.client.output import emit_json, note, table

POLL_SECONDS = 1.5
LOSS_SECONDS = 10.0  # the loss is read at most this often (the metrics list is not paged)
PLAIN_PROGRESS_SECONDS = 30.0  # a plain progress line at least this often while training
LOG_TAIL_LINES = 30
JOB_TERMINAL = {"succeeded": exits.SUCCEEDED, "failed": exits.JOB_FAILED,
                "cancelled": exits.CANCELLED}


def _number(value: Any, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.2f}{suffix}"


def progress_text(job: dict[str, Any], loss: float | None) -> str:
    """Where the job is: "running/training epoch 2/6, step 41 of 120 (34%), about 75 s left,
    loss 1.234" (the total and the time left once the first epoch is trained)."""
    where = job["status"] + (f"/{job['stage']}" if job.get("stage") else "")
    stage = job.get("stage_progress")
    if (stage and stage["stage"] == job.get("stage")
            and job["status"] in ("running", "cancelling")):  # the served evaluation
        where += (f" {stage['what']}, step {stage['steps_done']} of {stage['total_steps']} "
                  f"({stage['percent']:g}%)")
        if stage.get("eta_seconds"):
            where += f", about {stage['eta_seconds']:.0f} s left"
        return where
    progress = job.get("progress")
    if progress and job["status"] in ("running", "cancelling"):
        where += f" epoch {progress['epoch']}/{progress['epochs']}, step {progress['steps_done']}"
        if progress.get("total_steps"):
            where += f" of {progress['total_steps']} ({progress['percent']:g}%)"
            if progress.get("eta_seconds"):
                where += f", about {progress['eta_seconds']:.0f} s left"
        if loss is not None:
            where += f", loss {loss:.4g}"
    return where


def chosen_checkpoint(job: dict[str, Any], checkpoints: list[dict[str, Any]]
                      ) -> dict[str, Any] | None:
    """The checkpoint the evaluation chose, else the trainer's best."""
    chosen = (job.get("evaluation") or {}).get("checkpoint_id")
    return (next((c for c in checkpoints if c["id"] == chosen), None)
            or next((c for c in checkpoints if c.get("is_best")), None))


def job_summary(job: dict[str, Any], checkpoints: list[dict[str, Any]]) -> str:
    """One line: the final status (and error code), served acceptance length, speedup over no
    speculation (and the verdict when the drafter does not pay off), the best checkpoint's id,
    and its Hub URL once published."""
    evaluation = job.get("evaluation") or {}
    best = chosen_checkpoint(job, checkpoints)
    status = job["status"] + (f" ({job['error_code']})" if job.get("error_code") else "")
    verdict = f" ({job['verdict']['summary']})" if job.get("verdict") else ""
    winner = (f"winner {job['winner']}, " if job.get("winner")
              and len(job.get("candidates") or []) > 1 else "")
    line = (f"{job['id']} {status}: {winner}"
            f"served AL {_number(job.get('served_acceptance_length'))}, "
            f"speedup {_number(evaluation.get('speedup'), 'x')}{verdict}, "
            f"best checkpoint {best['id'] if best else '-'}")
    hub = next((c["hub_url"] for c in ([best] if best else []) + checkpoints if c.get("hub_url")),
               None)
    return line + (f", published {hub}" if hub else "")


LEADERBOARD = ("rank", "candidate", "kind", "status", "speedup", "served AL", "lossless",
               "train s", "train CPU s")


def leaderboard(job: dict[str, Any]) -> str | None:
    """A bake-off's candidates as a table, best first (the winner marked), then why any
    failed; None for a job of one drafter."""
    candidates = job.get("candidates") or []
    if len(candidates) < 2:
        return None

    def row(c: dict[str, Any]) -> dict[str, Any]:
        speedup = (f"{c['speedup']:.2f}x ±{c['speedup_spread'] or 0:.2f}"
                   if c.get("speedup") is not None else None)
        name = c["name"] + (" (winner)" if c.get("winner") else "")
        return {"rank": c.get("rank"), "candidate": name, "kind": c["kind"],
                "status": c["status"], "speedup": speedup,
                "served AL": c.get("served_acceptance_length"),
                "lossless": {True: "yes", False: "no"}.get(c.get("lossless")),
                "train s": c.get("train_seconds"), "train CPU s": c.get("train_cpu_seconds")}

    ranked = sorted(candidates, key=lambda c: (c.get("rank") is None, c.get("rank") or 0,
                                               c["index"]))
    lines = [table([row(c) for c in ranked], LEADERBOARD)]
    lines += [f"{c['name']} {c['status']}: {c['status_reason']}" for c in ranked
              if c["status"] in ("failed", "stopped") and c.get("status_reason")]
    return "\n".join(lines)


class PlainView:
    """Timestamped lines on stderr, for CI logs: each event, and the training progress when the
    epoch changes (or every PLAIN_PROGRESS_SECONDS)."""

    def __init__(self, subject: str) -> None:
        self.subject = subject
        self.last_text: str | None = None
        self.last_epoch: Any = None
        self.last_at = 0.0

    def __enter__(self) -> "PlainView":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def line(self, text: str) -> None:
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        note(f"{stamp} {self.subject} {text}")

    def event(self, event: dict[str, Any]) -> None:
        self.line(event["message"])

    def update(self, job: dict[str, Any], loss: float | None) -> None:
        text = progress_text(job, loss)
        epoch = (job.get("progress") or {}).get("epoch")
        due = time.monotonic() - self.last_at >= PLAIN_PROGRESS_SECONDS and text != self.last_text
        if epoch != self.last_epoch or (due and job.get("progress")):
            self.line(text)
            self.last_text, self.last_epoch, self.last_at = text, epoch, time.monotonic()


class LiveView:
    """A live progress bar on a terminal (stderr): status/stage, epoch bar, step, loss, time
    elapsed; events printed above it."""

    def __init__(self, subject: str) -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, Progress, SpinnerColumn, TextColumn,
                                   TimeElapsedColumn)

        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
                                 console=Console(stderr=True), transient=False)
        self.task = self.progress.add_task(subject, total=None, detail="")
        self.subject = subject

    def __enter__(self) -> "LiveView":
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def event(self, event: dict[str, Any]) -> None:
        self.progress.console.print(f"[dim]{event['created_at'][11:19]}[/dim] {event['message']}",
                                    highlight=False, markup=True)

    def update(self, job: dict[str, Any], loss: float | None) -> None:
        progress = job.get("progress")
        where = job["status"] + (f"/{job['stage']}" if job.get("stage") else "")
        detail = progress_text(job, loss).removeprefix(where).strip()
        fields: dict[str, Any] = {"description": f"{self.subject} {where}", "detail": detail}
        stage = job.get("stage_progress")
        if stage and stage["stage"] == job.get("stage"):  # the evaluation's own steps
            fields.update(total=stage["total_steps"], completed=stage["steps_done"])
        elif progress:
            done = progress["epochs"] if job.get("stage") not in (None, "training") \
                and job["status"] != "queued" else progress["epoch"] - 1
            fields.update(total=progress["epochs"], completed=done)
        self.progress.update(self.task, **fields)


def make_view(subject: str) -> PlainView | LiveView:
    return LiveView(subject) if sys.stderr.isatty() else PlainView(subject)


class _Clock:
    def __init__(self, timeout: float | None) -> None:
        self.deadline = None if timeout is None else time.monotonic() + timeout

    def left(self) -> float | None:
        return None if self.deadline is None else max(self.deadline - time.monotonic(), 0.0)

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def sleep(self, seconds: float) -> None:
        left = seconds if self.deadline is None else min(seconds, self.deadline - time.monotonic())
        time.sleep(max(left, 0.0))


def _new_events(api: Api, path: str, after: int | None, show: Callable[[dict[str, Any]], None]
                ) -> int | None:
    """Show the events after ``after``; the id of the last one shown."""
    while True:
        page = api.json("GET", path, params={"limit": 100} | ({"after": after} if after else {}))
        for event in page["data"]:
            show(event)
            after = event["id"]
        if not page["has_more"]:
            return after


def _latest_loss(api: Api, job_id: str) -> float | None:
    rows = api.json("GET", f"/api/jobs/{job_id}/metrics", params={"name": "train/loss"})["data"]
    return rows[-1]["value"] if rows else None


def _report(value: dict[str, Any], line: str, as_json: bool, *, final: bool = True) -> None:
    """How a wait ends on stdout: the line, or with --json the object (the line on stderr). A
    wait that another one follows (not ``final``) leaves stdout's object to that one."""
    if as_json:
        if final:
            emit_json(value)
        note(line)
    else:
        print(line, flush=True)


def wait_job(api: Api, job_id: str, *, timeout: float | None, as_json: bool,
             followed: bool = False) -> int:
    """Follow the job until it ends or ``timeout`` passes; print the summary (stdout; the job
    as JSON with --json, the summary then on stderr) and return the exit code. ``followed``: if
    the job succeeds, another wait follows (with --json, its object is printed, not the job's)."""
    clock = _Clock(timeout)
    after: int | None = None
    loss, loss_step, loss_at = None, None, 0.0
    with make_view(job_id) as view:
        while True:
            job = api.json("GET", f"/api/jobs/{job_id}")
            after = _new_events(api, f"/api/jobs/{job_id}/events", after, view.event)
            step = (job.get("progress") or {}).get("step")
            if step is not None and step != loss_step and time.monotonic() - loss_at >= LOSS_SECONDS:
                loss, loss_step, loss_at = _latest_loss(api, job_id), step, time.monotonic()
            view.update(job, loss)
            if job["status"] in JOB_TERMINAL:
                break
            if clock.expired():
                note(f"timed out after {timeout:g}s waiting for {job_id}; the job keeps going "
                     f"({progress_text(job, loss)}): `specdeck jobs wait {job_id}` waits again, "
                     f"`specdeck jobs cancel {job_id}` stops it")
                return exits.TIMED_OUT
            clock.sleep(POLL_SECONDS)
    checkpoints = api.json("GET", f"/api/jobs/{job_id}/checkpoints")["data"]
    summary = job_summary(job, checkpoints)
    if job["status"] == "failed":
        note(f"error: {job.get('error_code') or 'failed'}: {job.get('status_reason') or ''}")
        tail = api.request("GET", f"/api/jobs/{job_id}/logs",
                           params={"tail": LOG_TAIL_LINES}).text.rstrip("\n")
        if tail:
            note(f"--- the last {LOG_TAIL_LINES} lines of the job's log ---\n{tail}\n---")
    elif job["status"] == "cancelled" and job.get("status_reason"):
        note(f"cancelled: {job['status_reason']}")
    board = leaderboard(job)
    _report(job, f"{summary}\n{board}" if board else summary, as_json,
            final=not (followed and job["status"] == "succeeded"))
    return JOB_TERMINAL[job["status"]]


def wait_deployment(api: Api, deployment_id: str, *, timeout: float | None,
                    as_json: bool) -> int:
    """Wait until the deployment is ready (0) or ends without serving (failed or stopped: 1),
    printing its events; 4 once ``timeout`` passes."""
    clock = _Clock(timeout)
    after: int | None = None
    view = PlainView(deployment_id)
    while True:
        deployment = api.json("GET", f"/api/deployments/{deployment_id}")
        after = _new_events(api, f"/api/deployments/{deployment_id}/events", after, view.event)
        status = deployment["status"]
        if status in ("ready", "failed", "stopped"):
            break
        if clock.expired():
            note(f"timed out after {timeout:g}s waiting for {deployment_id} to be ready; it is "
                 f"{status}")
            return exits.TIMED_OUT
        clock.sleep(POLL_SECONDS)
    line = f"{deployment_id} {status}" + (f": {deployment['status_reason']}"
                                         if deployment.get("status_reason") else "")
    _report(deployment, line if as_json or status != "ready"
            else f"{line} (model '{deployment['name']}')", as_json)
    return exits.SUCCEEDED if status == "ready" else exits.JOB_FAILED


PROMOTION_TERMINAL = {"succeeded": exits.SUCCEEDED, "failed": exits.JOB_FAILED}


def find_promotion(api: Api, deployment_id: str, promotion_id: str) -> dict[str, Any]:
    """The promotion as the list shows it (newest first: it is on the first page)."""
    promotions = api.pages(f"/api/deployments/{deployment_id}/promotions", {"limit": 100})
    found = next((p for p in promotions if p["id"] == promotion_id), None)
    if found is None:
        raise CLIError(exits.USAGE, f"{deployment_id} has no promotion {promotion_id}")
    return found


def wait_promotion(api: Api, promotion: dict[str, Any], *, timeout: float | None,
                   as_json: bool) -> int:
    """Follow a promotion or rollback until every replica's switch ended, printing its steps
    (the deployment's ``promotion`` events from the one that asked for it on: one switch runs
    at a time, so the later ones are its replicas'); 0 when it succeeded, 1 when it failed (the
    previous drafter serves on), 4 once ``timeout`` passes."""
    deployment_id, promotion_id = promotion["deployment_id"], promotion["id"]
    replicas = len(promotion["replicas"])
    clock = _Clock(timeout)
    after: int | None = None
    view = PlainView(promotion_id)
    asked = False

    def step(event: dict[str, Any]) -> None:
        nonlocal asked
        if event["kind"] != "promotion":
            return
        asked = asked or (event["data"] or {}).get("promotion") == promotion_id
        if asked:
            view.line((f"replica {event['replica']}: " if replicas > 1 else "") + event["message"])

    while True:
        promotion = find_promotion(api, deployment_id, promotion_id)
        after = _new_events(api, f"/api/deployments/{deployment_id}/events", after, step)
        if promotion["status"] in PROMOTION_TERMINAL:
            break
        if clock.expired():
            note(f"timed out after {timeout:g}s waiting for {promotion_id}; the switch keeps going "
                 f"({promotion['status']}): `specdeck deployments promotions {deployment_id}` "
                 "shows where it is")
            return exits.TIMED_OUT
        clock.sleep(POLL_SECONDS)
    line = (f"{promotion_id} {promotion['status']}: {promotion['kind']} of {deployment_id} to "
            f"{promotion['target']['drafter']}")
    if promotion["status"] == "failed":
        line += f" ({promotion['status_reason']}; the previous drafter serves on)"
    _report(promotion, line, as_json)
    return PROMOTION_TERMINAL[promotion["status"]]


def wait_retrain(api: Api, job: dict[str, Any], *, timeout: float | None, as_json: bool) -> int:
    """Follow a retrain job (``wait_job``) and, when it deploys its result, the promotion its
    deploy stage asked for (``wait_promotion``): 0 once that switch succeeded. ``timeout``
    bounds both."""
    clock = _Clock(timeout)
    deploys = job.get("deploy") is not None
    code = wait_job(api, job["id"], timeout=timeout, as_json=as_json, followed=deploys)
    if code != exits.SUCCEEDED or not deploys:
        return code
    [asked] = [e["data"] for e in api.pages(f"/api/jobs/{job['id']}/events", {"limit": 100})
               if e["kind"] == "deploy"]
    return wait_promotion(api, find_promotion(api, asked["deployment"], asked["promotion"]),
                          timeout=clock.left(), as_json=as_json)
