"""``specdeck openapi``: the real command in a subprocess writes the app's OpenAPI document as
JSON, with no database to reach, and keeps its start-up warning out of the document."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from app.main import create_app
from tests.conftest import ROOT, SPECDECK


def run_openapi(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECDECK_")}
    env.update(PYTHONPATH=str(ROOT),  # this checkout's app, not an installed one
               # Nothing listens there: the command must not need a database or a broker.
               SPECDECK_DATABASE_URL="postgresql+psycopg://nobody@127.0.0.1:9/none",
               SPECDECK_BROKER_URL="redis://127.0.0.1:9/0")
    return subprocess.run([SPECDECK, "openapi", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_openapi_writes_the_document_to_stdout_or_a_file(tmp_path: Path) -> None:
    run = run_openapi(cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    document = json.loads(run.stdout)
    assert document == create_app().openapi()
    assert {"/api/me", "/api/deployments/{deployment_id}/events"} <= set(document["paths"])
    assert run.stdout == json.dumps(document, indent=2) + "\n"  # as written, not sorted
    # SPECDECK_SECRET_KEY is unset: its warning goes to stderr, never into the document.
    assert "SPECDECK_SECRET_KEY" in run.stderr

    written = run_openapi("-o", "openapi.json", cwd=tmp_path)
    assert written.returncode == 0 and written.stdout == "", written.stderr
    assert (tmp_path / "openapi.json").read_text(encoding="utf-8") == run.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["openapi.json"]  # nothing else made
