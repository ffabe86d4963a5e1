"""docker-compose.yml cannot run here (no Docker engine): parse it and check that it runs the
same entry points as the Makefile, the CLI and the tests."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from app.cli import API_COMMAND, MIGRATE_COMMAND, WORKER_COMMAND, build_parser

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def commands(service: str) -> list[list[str]]:
    """The specdeck invocations in a service's command (``sh -c "a && exec b"`` included)."""
    command = COMPOSE["services"][service]["command"]
    if command[:2] == ["sh", "-c"]:
        parts = re.split(r"&&|;", command[2])
        return [[w for w in shlex.split(p) if w != "exec"] for p in parts]
    return [command]


def test_services_and_healthchecks() -> None:
    services = COMPOSE["services"]
    assert set(services) >= {"postgres", "redis", "api", "worker"}
    for name in ("postgres", "redis", "api"):
        assert services[name]["healthcheck"]["test"], name
    assert services["api"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["api"]["depends_on"]["redis"]["condition"] == "service_healthy"
    gpu = services["worker"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"]


def test_both_backends_are_switched_by_environment() -> None:
    for name in ("api", "worker"):
        env = COMPOSE["services"][name]["environment"]
        assert env["SPECDECK_DATABASE_URL"].startswith("postgresql+psycopg://")
        assert env["SPECDECK_BROKER_URL"].startswith("redis://")
        assert env["SPECDECK_ENV"] == "production"


def test_api_migrates_before_it_starts() -> None:
    api = commands("api")
    assert api[0] == MIGRATE_COMMAND
    assert api[1][:2] == API_COMMAND


def test_worker_runs_the_worker_entry_point() -> None:
    assert commands("worker") == [WORKER_COMMAND]


def test_every_compose_command_parses_with_the_real_cli() -> None:
    parser = build_parser()
    for service in ("api", "worker"):
        for argv in commands(service):
            assert argv[0] == "specdeck"
            parser.parse_args(argv[1:])  # exits (fails the test) on an unknown command or flag


def test_the_makefile_uses_the_same_cli() -> None:
    makefile = (ROOT / "Makefile").read_text()
    # `specdeck run` migrates, then starts API_COMMAND and WORKER_COMMAND (tests/e2e checks
    # the processes it starts).
    assert "$(BIN)/specdeck run" in makefile
