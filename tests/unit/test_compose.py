"""docker-compose.yml and the Dockerfile cannot run here (no Docker engine): parse them and
check that they run the same entry points as the Makefile, the CLI and the tests, and that the
image carries the dashboard where the API looks for it."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
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


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's stages, each a list of (INSTRUCTION, arguments)."""
    stages: list[list[tuple[str, str]]] = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            instruction, _, arguments = line.strip().partition(" ")
            if instruction.upper() == "FROM":
                stages.append([])
            stages[-1].append((instruction.upper(), arguments))
    return stages


def test_the_image_builds_the_dashboard_in_a_node_stage() -> None:
    node, final = dockerfile_stages()
    image, _, name = node[0][1].partition(" AS ")
    version = re.fullmatch(r"node:(\d+)-slim", image)
    assert version and int(version[1]) >= 20
    (build,) = [arguments for instruction, arguments in node if instruction == "RUN"]
    assert "npm ci && npm run build" in build and "[ -f package.json ]" in build
    copies = [arguments.split() for instruction, arguments in final if instruction == "COPY"]
    source, target = next(c[1:] for c in copies if c[0] == f"--from={name}")
    workdir = Path(next(arguments for instruction, arguments in node if instruction == "WORKDIR"))
    assert Path(source) == workdir / "dist"
    # The API finds it where SPECDECK_DASHBOARD_DIR's default points: beside app/.
    from app.settings import REPOSITORY, Settings

    default = Settings.model_fields["dashboard_dir"].default
    app_dir = Path(next(arguments for instruction, arguments in final if instruction == "WORKDIR"))
    assert ["app", "./app"] in copies
    assert app_dir / target == app_dir / default.relative_to(REPOSITORY)


def test_the_node_stage_leaves_a_dist_folder_with_no_frontend_to_build(tmp_path: Path) -> None:
    """COPY --from fails on a folder that is not there: with no package.json yet, the stage's
    RUN (run here by sh, in a copy of frontend/) still leaves an empty dist/."""
    node, _ = dockerfile_stages()
    (build,) = [arguments for instruction, arguments in node if instruction == "RUN"]
    frontend = tmp_path / "frontend"
    shutil.copytree(ROOT / "frontend", frontend, ignore=shutil.ignore_patterns(
        "package.json", "node_modules", "dist"))
    subprocess.run(["sh", "-c", build], cwd=frontend, check=True, env={"PATH": "/usr/bin:/bin"})
    assert (frontend / "dist").is_dir() and not list((frontend / "dist").iterdir())
