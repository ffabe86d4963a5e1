"""The dashboard's typed client is fresh: the committed ``frontend/openapi.json`` is the app's
OpenAPI document, and ``frontend/src/api/schema.d.ts`` is what openapi-typescript makes of it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from app.main import create_app
from tests.conftest import ROOT

FRONTEND = ROOT / "frontend"
DOCUMENT = FRONTEND / "openapi.json"
SCHEMA = FRONTEND / "src" / "api" / "schema.d.ts"

REGENERATE = (
    "Regenerate the dashboard's client: `specdeck openapi -o frontend/openapi.json && "
    "(cd frontend && npm run gen:api)` (without `specdeck openapi`: `python -c \"import json; "
    "from app.main import create_app; print(json.dumps(create_app().openapi(), indent=2))\" "
    "> frontend/openapi.json`), and commit both files."
)


def test_committed_openapi_document_is_the_apps() -> None:
    committed = json.loads(DOCUMENT.read_text())
    assert committed == create_app().openapi(), f"frontend/openapi.json is stale. {REGENERATE}"


def test_generated_schema_matches_the_committed_document(tmp_path: Path) -> None:
    if not (FRONTEND / "node_modules" / ".bin" / "openapi-typescript").exists():
        pytest.skip("frontend/node_modules is missing (`make install` with Node.js >= 20, or "
                    "`cd frontend && npm ci`, creates it): schema.d.ts is not checked")
    npx = shutil.which("npx")
    assert npx, "frontend/node_modules exists but npx is not on PATH"
    generated = tmp_path / "schema.d.ts"
    run = subprocess.run([npx, "openapi-typescript", str(DOCUMENT), "-o", str(generated)],
                         cwd=FRONTEND, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert generated.read_bytes() == SCHEMA.read_bytes(), \
        f"frontend/src/api/schema.d.ts is stale. {REGENERATE}"
