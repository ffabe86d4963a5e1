"""scripts/gpu-smoke.sh needs a GPU and vLLM, so it cannot run here. What can rot silently is
checked instead: it parses (and passes shellcheck where installed), every REST call it makes
is a route and method of the OpenAPI document, every specdeck command parses with the real
CLI, its request bodies validate against the API's own models, and the fields, statuses and
figures it reads exist."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-smoke.sh"
TEXT = SCRIPT.read_text()


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    from app.main import create_app

    return create_app().openapi()


def heredoc(variable: str, **values: str) -> str:
    """The body a ``VARIABLE=$(cat <<JSON ... JSON)`` builds, its ${NAME}s given ``values``."""
    body = re.search(rf"{variable}=\$\(\n\s*cat <<JSON\n(.*?)\nJSON\n\)", TEXT, re.S)
    assert body, variable
    return re.sub(r"\$\{(\w+)\}", lambda m: values[m[1]], body[1])


def test_it_parses() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_shellcheck_is_clean() -> None:
    subprocess.run(["shellcheck", str(SCRIPT)], check=True)


def test_every_rest_call_is_a_route_of_the_api(openapi: dict[str, Any]) -> None:
    calls = re.findall(r'\bapi (GET|POST|DELETE) "?(/[^"\s)]+)', TEXT)
    assert {path.split("/")[1] for _, path in calls} == {"api", "v1"}
    assert len(calls) >= 9
    for method, path in calls:
        path, _, query = path.partition("?")
        template = re.sub(r"\$\{\w+\}", "{}", path)
        matches = [p for p in openapi["paths"]
                   if re.fullmatch(re.sub(r"\{\w+\}", "{}", re.escape(p).replace(r"\{", "{")
                                          .replace(r"\}", "}")), template)]
        assert matches, path
        operation = openapi["paths"][matches[0]].get(method.lower())
        assert operation, f"{method} {path}"
        names = {p["name"] for p in operation.get("parameters", [])}
        for name in re.findall(r"(\w+)=", query):
            assert name in names, f"{method} {path} has no query parameter {name}"


def test_every_specdeck_command_parses_with_the_real_cli() -> None:
    from app.cli import build_parser

    commands = re.findall(r'"\$SPECDECK" ([^|&;>\n]+)', TEXT)
    assert {c.split()[0] for c in commands} == {"run", "doctor"}
    for command in commands:
        argv = [re.sub(r"\$\{?\w+\}?", "1", word) for word in shlex.split(command)]
        build_parser().parse_args(argv)  # exits (fails the test) on an unknown command or flag


@pytest.mark.parametrize("share", ["true", "false"])
def test_the_job_it_submits_is_valid(share: str) -> None:
    from app.schemas.jobs import JobCreate
    from app.services.jobs import resolve_gate

    job = JobCreate.model_validate_json(heredoc("JOB_BODY", DATASET="ds_x", SHARE=share))
    assert (job.runtime, job.verifier) == ("vllm", "demo")  # the verifier `specdeck run` makes
    assert job.resources.share_verifier_gpus is (share == "true")
    # The figures are reported, not gated: a tiny verifier need not be faster with a drafter.
    assert job.evaluate is not None and resolve_gate(job, "vllm") is None


def test_the_deployment_and_the_chat_it_sends_are_valid() -> None:
    from app.schemas.deployments import DeploymentCreate
    from app.schemas.openai import ChatCompletionRequest

    deployment = DeploymentCreate.model_validate_json(heredoc("DEPLOYMENT_BODY", BEST="ckpt_" + "0" * 24))
    chat = ChatCompletionRequest.model_validate_json(heredoc("CHAT_BODY"))
    assert chat.model == deployment.name


def test_the_fields_statuses_and_figures_it_reads_exist(openapi: dict[str, Any]) -> None:
    from app.services.state import DeploymentStatus, JobStatus
    from workers.pipeline.evaluate import HEADLINE

    properties = {name for schema in openapi["components"]["schemas"].values()
                  for name in schema.get("properties", {})}
    read = set(re.findall(r'\b[dcs]\["(\w+)"\]', TEXT)) - {"usage", "completion_tokens"}
    assert read and read <= properties, read - properties
    for line in re.findall(r"wait_status \"/api/(jobs|deployments)/[^\"]+\" \S+ ([a-z ]+)", TEXT):
        kind, statuses = line
        enum = JobStatus if kind == "jobs" else DeploymentStatus
        assert set(statuses.split()) <= {s.value for s in enum}
    figures = re.search(r"FIGURES=\(([^)]*)\)", TEXT)[1].split()
    assert figures and set(figures) <= set(HEADLINE)


def test_it_reads_the_banner_of_specdeck_run_as_the_tests_do() -> None:
    """tests/support/specdeck_run.py reads the same lines of the real banner (tests/e2e)."""
    helper = (ROOT / "tests" / "support" / "specdeck_run.py").read_text()
    for marker in ("Ctrl-C stops", "API key \\(project 'default'\\): ", "demo dataset: "):
        assert marker in helper
        assert marker.replace("\\", "") in TEXT.replace("\\(", "(").replace("\\)", ")")
