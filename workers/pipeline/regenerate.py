"""Stage: on-policy data. The verifier writes every reply itself.

The verifier is served without speculation (``vllm serve VERIFIER``, on either runtime), and
``speculators regenerate-responses`` sends it the system and user turns of every conversation
(an upload, or a public preset) and writes one row per reply with the exact prompt and
completion token ids (``input_ids``, ``loss_mask``). prepare-data takes those rows as they are,
so the drafter trains on the token ids the verifier really produces, not on a re-tokenized
decode of them.

Progress (conversations done of the total) goes into events and metrics as the output grows.
regenerate-responses appends a conversation's rows once it is finished and resumes from its
output file (``--resume``), so a job resumed after its worker died carries on where it stopped;
a cancel stops the server and the client's process groups at once.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from app.db.models import JobMetric
from app.logtail import tail
from app.runtimes import regeneration_commands, regeneration_source
from app.schemas.job_spec import JobSpec
from workers.pipeline.data import write_captured
from workers.readiness import free_port, wait_ready
from workers.runner import JobContext, StageFailed

log = logging.getLogger(__name__)

PROGRESS_SECONDS = 2.0  # how often the output file is looked at
EVENT_EVERY = 0.1  # an event each time another tenth of the conversations is done
METRIC = "data/regenerated_conversations"


def done_marker(ctx: JobContext) -> Path:
    return ctx.paths.regenerated.with_suffix(".done")


def drop_partial_line(path: Path) -> None:
    """A worker killed mid-write can leave half a row at the end: cut it off, so the resume
    redoes that conversation and prepare-data reads whole rows only."""
    if not path.is_file():
        return
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end != len(data):
        with path.open("r+b") as f:
            f.truncate(end)


def conversations_done(path: Path) -> int:
    """Finished conversations in the output: rows carry their conversation's ``primary_id``."""
    if not path.is_file():
        return 0
    seen: set[str] = set()
    with path.open("rb") as f:
        for raw in f:
            try:
                seen.add(str(json.loads(raw).get("primary_id")))
            except (ValueError, AttributeError):
                continue  # a row still being written
    return len(seen)


def conversations_total(source: str, max_samples: int | None) -> int | None:
    """How many conversations will be regenerated, when it can be known (a local file)."""
    path = Path(source)
    if not path.is_file():
        return max_samples  # a preset: at most max_samples, or unknown
    with path.open("rb") as f:
        lines = sum(1 for raw in f if raw.strip())
    return min(lines, max_samples) if max_samples is not None else lines


class Progress:
    """Watches the output file in a thread while regenerate-responses runs; writes a metric at
    every change and an event at every tenth done."""

    def __init__(self, ctx: JobContext, total: int | None) -> None:
        self.ctx, self.total = ctx, total
        self.done = conversations_done(ctx.paths.regenerated)
        self._reported_tenth = self._tenth(self.done)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="regenerate-progress",
                                        daemon=True)

    def _tenth(self, done: int) -> int:
        return int(done / self.total / EVENT_EVERY) if self.total else 0

    def message(self, done: int) -> str:
        of = f" of {self.total}" if self.total else ""
        return f"regenerated {done}{of} conversations with the verifier"

    def _loop(self) -> None:
        while not self._stop.wait(PROGRESS_SECONDS):
            try:
                self.report()
            except Exception:  # progress is best effort; the stage's outcome does not depend on it
                log.warning("job %s: regeneration progress not recorded this round", self.ctx.job_id,
                            exc_info=True)

    def report(self) -> None:
        done = conversations_done(self.ctx.paths.regenerated)
        if done == self.done:
            return
        self.done = done
        self.ctx.write(lambda session: session.add(
            JobMetric(job_id=self.ctx.job_id, step=done, epoch=None, name=METRIC, value=done)))
        tenth = self._tenth(done)
        if tenth > self._reported_tenth:
            self._reported_tenth = tenth
            self.ctx.event("progress", self.message(done), {"done": done, "total": self.total})

    def __enter__(self) -> "Progress":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def regenerate(ctx: JobContext[JobSpec]) -> None:
    out = ctx.paths.regenerated
    if done_marker(ctx).is_file():
        ctx.event("skipped", f"the verifier's replies are already regenerated ({out.name})")
        return
    write_captured(ctx)
    settings = ctx.spec.data
    source = regeneration_source(ctx.spec, ctx.paths)
    total = conversations_total(source, settings.max_samples)
    out.parent.mkdir(parents=True, exist_ok=True)
    drop_partial_line(out)
    done = conversations_done(out)  # by an earlier attempt of this job

    port = free_port()
    verifier_gpus = list((ctx.spec.allocation or {}).get("verifier", []))
    server_command, client_command = regeneration_commands(ctx.spec, ctx.paths, port=port,
                                                           verifier_gpus=verifier_gpus, done=done)
    log_path = ctx.paths.root / "regeneration-server.log"
    server = ctx.start(server_command, log_path=log_path)
    ctx.on_cleanup(lambda: ctx.stop(server))
    try:
        wait_ready(ctx, server, f"http://127.0.0.1:{port}", ctx.spec.verifier_info.reference,
                   what="generating server", log_path=log_path,
                   timeout=ctx.settings.verifier_ready_seconds)
        ctx.watch("generating server", server, log_path)
        progress = Progress(ctx, total)
        ctx.event("regeneration_started", f"the verifier writes the replies of {source}"
                  + (f" ({progress.done} conversations already done)" if progress.done else ""),
                  {"source": source, "total": total, "done": progress.done,
                   **settings.model_dump()})
        with progress:
            ctx.run(client_command)
        progress.report()
    finally:
        ctx.stop(server)  # its GPUs are the hidden-states server's next

    if progress.done == 0:
        raise StageFailed("regenerate-responses wrote no conversation (see the log and "
                          f"{out.with_name(out.stem + '.errors.jsonl').name})",
                          code="data_error", log_tail=tail(ctx.paths.log))
    errors = out.with_name(f"{out.stem}.errors{out.suffix}")
    failed = sum(1 for _ in errors.open("rb")) if errors.is_file() else 0
    done_marker(ctx).write_text(json.dumps({"conversations": progress.done,
                                            "errors": failed}) + "\n")
    ctx.event("regenerated", progress.message(progress.done)
              + (f"; {failed} failed (see {errors.name})" if failed else ""),
              {"done": progress.done, "total": total, "errors": failed})
