"""Following a job's log and metrics by cursor (issue 23, item 13): GET /api/jobs/{id}/logs
answers its last lines with X-Log-Offset; with ``after`` it answers the lines written since,
waiting for them up to ``wait`` seconds, so that a live page asks once per batch of lines.
GET /api/jobs/{id}/metrics with ``after`` answers only the metrics recorded since."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from app.supervise import die_with_parent
from tests.conftest import SPECDECK, Api, Stack, new_key
from tests.support.waiting import wait_for
from tests.support.api_server import start_api, stop_api
from tests.support.errors import assert_error


def log_of(stack: Stack, job_id: str) -> Path:
    path = Path(stack.env["SPECDECK_LOGS_ROOT"]) / f"{job_id}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def test_the_log_is_read_by_offset_waiting_for_new_lines(api: Api, stack: Stack, job_body) -> None:
    job_id = api.post("/api/jobs", json=job_body()).json()["id"]  # no worker: queued, not ended
    path = log_of(stack, job_id)
    empty = api.get(f"/api/jobs/{job_id}/logs")
    assert empty.status_code == 200 and empty.text == "" and empty.headers["X-Log-Offset"] == "0"
    assert empty.headers["X-Log-Ended"] == "false"

    append(path, "one\ntwo\nthree\nhalf a li")
    last = api.get(f"/api/jobs/{job_id}/logs", params={"tail": 2})
    assert last.text == "two\nthree\n"  # the line being written comes with the next read
    offset = int(last.headers["X-Log-Offset"])
    assert offset == len("one\ntwo\nthree\n")

    # Nothing new: after the wait, an empty answer at the same offset.
    idle = api.get(f"/api/jobs/{job_id}/logs", params={"after": offset, "wait": 0.5})
    assert idle.text == "" and int(idle.headers["X-Log-Offset"]) == offset

    # A reader waiting gets the lines once they are written, in one answer.
    answers = []
    reader = threading.Thread(target=lambda: answers.append(api.get(
        f"/api/jobs/{job_id}/logs", params={"after": offset, "wait": 30})))
    reader.start()
    time.sleep(0.5)
    append(path, "ne\nfour\n")
    reader.join(60)
    [batch] = answers
    assert batch.status_code == 200 and batch.text == "half a line\nfour\n"
    offset = int(batch.headers["X-Log-Offset"])
    assert offset == path.stat().st_size

    # A log written anew (a shorter file) is read from its start.
    path.write_text("fresh\n")
    assert api.get(f"/api/jobs/{job_id}/logs", params={"after": offset}).text == "fresh\n"

    # A reader waiting when the job ends is answered then, and told so.
    answers.clear()
    reader = threading.Thread(target=lambda: answers.append(api.get(
        f"/api/jobs/{job_id}/logs", params={"after": len("fresh\n"), "wait": 30})))
    reader.start()
    time.sleep(0.5)
    assert api.post(f"/api/jobs/{job_id}/cancel").json()["status"] == "cancelled"
    reader.join(60)
    [end] = answers
    assert end.text == "" and end.headers["X-Log-Ended"] == "true"

    for bad in ({"after": -1}, {"wait": 31}, {"wait": "soon"}):
        assert_error(api.get(f"/api/jobs/{job_id}/logs", params=bad), 422, "invalid_value")


def test_an_ended_jobs_log_answers_at_once(api: Api, stack: Stack, job_body) -> None:
    job_id = api.post("/api/jobs", json=job_body()).json()["id"]
    assert api.post(f"/api/jobs/{job_id}/cancel").status_code == 200
    append(log_of(stack, job_id), "done\n")
    answer = api.get(f"/api/jobs/{job_id}/logs", params={"after": 5, "wait": 30})
    assert answer.text == "" and answer.headers["X-Log-Offset"] == "5"
    assert answer.headers["X-Log-Ended"] == "true"  # a reader stops following


def test_metrics_after_a_cursor(api: Api, job_body) -> None:
    from app.db import session_scope
    from app.db.models import JobMetric

    job_id = api.post("/api/jobs", json=job_body()).json()["id"]
    url = f"/api/jobs/{job_id}/metrics"
    assert api.get(url).json()["last_id"] == 0  # the cursor to pass while there are none
    with session_scope() as session:
        session.add_all(JobMetric(job_id=job_id, step=s, epoch=0, name="loss", value=1.0 / (s + 1))
                        for s in range(3))
    first = api.get(url).json()
    assert [m["step"] for m in first["data"]] == [0, 1, 2]
    cursor = first["last_id"]
    assert api.get(url, params={"after": cursor}).json() == {
        "object": "list", "data": [], "has_more": False, "last_id": cursor}
    with session_scope() as session:
        session.add(JobMetric(job_id=job_id, step=3, epoch=1, name="loss", value=0.2))
    new = api.get(url, params={"after": cursor}).json()
    assert [m["step"] for m in new["data"]] == [3] and new["last_id"] > cursor


def sse(response: httpx.Response) -> Iterator[dict[str, str]]:
    event: dict[str, str] = {}
    for line in response.iter_lines():
        if not line:
            if event:
                yield event
            event = {}
        elif not line.startswith(":"):  # a comment is a keep-alive
            name, _, value = line.partition(": ")
            event[name] = value


def read_stream(api: httpx.Client, job_id: str, into: list[dict[str, str]], **headers: str
                ) -> None:
    with api.stream("GET", f"/api/jobs/{job_id}/logs/stream", params={"tail": 2},
                    headers=headers) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        into.extend(sse(response))


def lines_of(events: list[dict[str, str]]) -> str:
    return "".join(json.loads(e["data"]) for e in events if e["event"] == "lines")


def test_the_cli_and_the_log_stream_follow_a_running_jobs_log_until_it_ends(
        pg_stack: Stack, pg_job_body, tmp_path: Path) -> None:
    """`specdeck jobs logs JOB --follow` and GET /api/jobs/{id}/logs/stream (what the dashboard
    reads) against a real API process: the last lines, each line as it is written, and an end
    once the job has ended. A stream resumed with Last-Event-ID goes on from there."""
    url, api_proc = start_api({**os.environ, **pg_stack.env}, tmp_path / "api.log")
    cli = None
    try:
        key = new_key()
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        job_id = api.post("/api/jobs", json=pg_job_body()).json()["id"]
        path = log_of(pg_stack, job_id)
        append(path, "one\ntwo\nthree\n")
        cli = subprocess.Popen([SPECDECK, "jobs", "logs", job_id, "--tail", "2", "--follow"],
                               env={**os.environ, "SPECDECK_URL": url, "SPECDECK_API_KEY": key},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True, preexec_fn=die_with_parent)
        out: list[str] = []
        threading.Thread(target=lambda: out.extend(cli.stdout), daemon=True).start()
        events: list[dict[str, str]] = []
        stream = threading.Thread(target=read_stream, args=(api, job_id, events))
        stream.start()
        wait_for(lambda: out == ["two\n", "three\n"], 60, "the last two lines")
        wait_for(lambda: lines_of(events) == "two\nthree\n", 60, "the stream's last two lines")
        append(path, "four\n")
        wait_for(lambda: out[-1:] == ["four\n"], 60, "the line written while following")
        wait_for(lambda: lines_of(events).endswith("four\n"), 60, "the line in the stream")
        append(path, "cancelled\n")  # the job's last line, then its end
        assert api.post(f"/api/jobs/{job_id}/cancel").json()["status"] == "cancelled"
        assert cli.wait(60) == 0  # told the job ended, within a second of it
        assert "".join(out) == "two\nthree\nfour\ncancelled\n"
        stream.join(60)
        assert not stream.is_alive() and events[-1] == {"event": "end", "data": "{}"}
        assert lines_of(events) == "two\nthree\nfour\ncancelled\n"
        assert int(events[-2]["id"]) == path.stat().st_size  # the offset after its lines

        resumed: list[dict[str, str]] = []  # a dropped stream goes on where it stopped
        read_stream(api, job_id, resumed, **{"Last-Event-ID": str(len("one\ntwo\n"))})
        assert lines_of(resumed) == "three\nfour\ncancelled\n" and resumed[-1]["event"] == "end"
    finally:
        if cli is not None and cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
            cli.wait()
        stop_api(api_proc)
