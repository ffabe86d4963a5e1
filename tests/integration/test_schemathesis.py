"""Schemathesis against the live API: a real ``specdeck api`` process on a fresh Postgres
database, fuzzed from its own /openapi.json with every check (as ``--checks all``) and a bounded
number of examples per operation. Every route is in the run, so a new endpoint is fuzzed from
the day it is added; tests/integration/schemathesis.toml holds the few answers a schema cannot
predict, each with its reason.

No worker runs, so what the fuzzer creates stays pending. The server cannot reach the network:
a Hub id given as a verifier or drafter fails at once instead of retrying for seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import REDIS_URL, ROOT, configure, write_dataset, write_verifier
from tests.integration.schemathesis_hooks import DECOY_KEY_ID, FUZZER_KEY_ID
from tests.integration.test_deployments_api import write_drafter
from tests.support.api_server import start_api, stop_api

SCHEMATHESIS = str(Path(sys.executable).parent / "schemathesis")
CONFIG = Path(__file__).with_name("schemathesis.toml")
MAX_EXAMPLES = 100  # per operation and phase: about two minutes on two cores
SEED = 20261123  # the same cases on every run; change it to explore others
# Safety deadlines, generous for a busy machine: for each request (Schemathesis' default is
# 10 s; the config file's shorter one for the event stream stays) and for the whole run.
REQUEST_TIMEOUT = "60"
RUN_TIMEOUT = 1500

pytestmark = pytest.mark.timeout(RUN_TIMEOUT + 300)


def test_the_api_answers_as_its_openapi_document_says(pg_url: str, roots: dict[str, str],
                                                      tmp_path: Path) -> None:
    env = {"SPECDECK_DATABASE_URL": pg_url, "SPECDECK_BROKER_URL": REDIS_URL,
           "SPECDECK_QUEUE": f"specdeck-schemathesis-{uuid.uuid4().hex[:8]}", **roots}
    configure(env)
    key, key_ids = fuzzer_key()
    # What the config's dictionaries name: a verifier, a DFlash drafter and a JSONL dataset.
    models, data = Path(roots["SPECDECK_MODELS_ROOT"]), Path(roots["SPECDECK_DATA_ROOT"])
    assert (write_verifier(models), write_drafter(models), write_dataset(data)) == (
        "tiny", "drafter", "chat.jsonl")
    server_env = {**os.environ, **env, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
                  # Offline: the Hub client fails at once, and its endpoint is a closed port.
                  "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9",
                  # Off, so that the fuzzer's /v1 requests reach the gateway's own checks.
                  "SPECDECK_GATEWAY_RATE_LIMIT_RPM": "0",
                  # Webhooks to the dictionary's URL can be created (no worker sends them).
                  "SPECDECK_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1"}
    log = tmp_path / "api.log"
    url, proc = start_api(server_env, log)
    report = tmp_path / "report.json"
    try:
        run = subprocess.run(
            [SCHEMATHESIS, "--config-file", str(CONFIG), "run", f"{url}/openapi.json",
             # Every check runs: Schemathesis 4's default, the same as `--checks all`, which
             # would also override the config file's few per-operation exceptions.
             "--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED),
             "--request-timeout", REQUEST_TIMEOUT,
             "--header", f"Authorization: Bearer {key}", "--generation-database", "none",
             "--report", "json", "--report-json-path", str(report), "--no-color"],
            cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **key_ids,
                 "SCHEMATHESIS_HOOKS": "tests.integration.schemathesis_hooks"})
    finally:
        stop_api(proc)
    output = f"{run.stdout[-20000:]}\n{run.stderr[-5000:]}\n--- api log ---\n" + \
        log.read_text(errors="replace")[-5000:]
    result = json.loads(report.read_text())
    failures = {f"{f['code']} {f['title']}": f["operations"] for f in result["failures"]}
    assert result["complete"] and result["operations"]["errored"] == 0, output
    assert result["operations"]["tested"] == result["operations"]["total"], output
    assert not [f for f in failures if f.startswith("ST101 ")], output  # server errors
    assert not [f for f in failures if f.startswith("ST108 ")], output  # response schema
    assert failures == {} and result["errors"] == [], output
    assert run.returncode == 0, output
    assert "Traceback" not in log.read_text(errors="replace"), output
    # The hook kept the fuzzer's own key from being revoked (its decoy may have been).
    from app.db import session_scope
    from app.db.models import ApiKey

    with session_scope() as session:
        assert session.get(ApiKey, key_ids[FUZZER_KEY_ID]).revoked_at is None


def fuzzer_key() -> tuple[str, dict[str, str]]:
    """The key Schemathesis sends, and the ids of it and its decoy (schemathesis_hooks.py)."""
    from app.db import session_scope
    from app.services.keys import add_key, create_key

    with session_scope() as session:
        fuzzer = create_key(session, f"fuzz-{uuid.uuid4().hex[:8]}", "schemathesis")
        decoy = add_key(session, fuzzer.key.project_id, "decoy")
        return fuzzer.plaintext, {FUZZER_KEY_ID: fuzzer.key.id, DECOY_KEY_ID: decoy.key.id}
