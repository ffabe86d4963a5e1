"""docker-compose.yml and the Dockerfile cannot run here (no Docker engine): parse them and
check that they run the same entry points as the Makefile, the CLI and the tests, that each
image installs what its role needs (vLLM at the pin for the GPU worker, no torch for the API),
and that the API image carries the dashboard where the API looks for it."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import sys
import tomllib

import yaml
from packaging.requirements import Requirement

from app.cli import API_COMMAND, MIGRATE_COMMAND, WORKER_COMMAND, build_parser

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


SPECDECK_SERVICES = ("api", "worker", "worker-cpu", "worker-cpu-2")


def commands(service: str) -> list[list[str]]:
    """The specdeck invocations in a service's command and healthcheck (``sh -c "a && exec b"``
    included)."""
    found = []
    definition = COMPOSE["services"][service]
    for command in (definition["command"], definition.get("healthcheck", {}).get("test", [])):
        if command[:1] == ["CMD"]:
            command = command[1:]
        if command[:2] == ["sh", "-c"]:
            parts = re.split(r"&&|;", command[2])
            found += [[w for w in shlex.split(p) if w != "exec"] for p in parts]
        elif command[:1] == ["specdeck"]:
            found.append(command)
    return found


def test_services_and_healthchecks() -> None:
    services = COMPOSE["services"]
    assert set(services) >= {"postgres", "redis", *SPECDECK_SERVICES}
    for name in ("postgres", "redis", *SPECDECK_SERVICES):
        assert services[name]["healthcheck"]["test"], name
    assert services["api"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["api"]["depends_on"]["redis"]["condition"] == "service_healthy"
    gpu = services["worker"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"]


def test_both_backends_are_switched_by_environment() -> None:
    for name in SPECDECK_SERVICES:
        env = COMPOSE["services"][name]["environment"]
        assert env["SPECDECK_DATABASE_URL"].startswith("postgresql+psycopg://")
        assert env["SPECDECK_BROKER_URL"].startswith("redis://")
        assert env["SPECDECK_ENV"] == "production"


def test_caches_live_on_the_named_volume() -> None:
    """The Hub's downloads and vLLM's caches outlive a recreated container: they are on the
    named volume every SpecDeck service mounts, not in the container's own layer."""
    assert "specdeck" in COMPOSE["volumes"]
    for name in SPECDECK_SERVICES:
        service = COMPOSE["services"][name]
        mounts = [v.split(":") for v in service["volumes"]]
        on_volume = [target for source, target, *_ in mounts if source == "specdeck"]
        for variable in ("HF_HOME", "VLLM_CACHE_ROOT"):
            path = service["environment"][variable]
            assert any(path.startswith(target + "/") for target in on_volume), (name, variable)


def test_api_migrates_before_it_starts() -> None:
    api = commands("api")
    assert api[0] == MIGRATE_COMMAND
    assert api[1][:2] == API_COMMAND


def test_workers_run_the_worker_entry_point_and_the_doctor_for_their_runtime() -> None:
    for service, runtime in (("worker", "vllm"), ("worker-cpu", "local")):
        assert commands(service) == [WORKER_COMMAND, ["specdeck", "doctor", "--runtime", runtime]]


def test_every_compose_command_parses_with_the_real_cli() -> None:
    parser = build_parser()
    for service in SPECDECK_SERVICES:
        for argv in commands(service):
            assert argv[0] == "specdeck"
            parser.parse_args(argv[1:])  # exits (fails the test) on an unknown command or flag


def test_each_worker_has_its_profile_and_image() -> None:
    """`docker compose --profile cpu up` is the whole stack on a laptop: the CPU worker and not
    the GPU one (whose GPU reservation fails on a host without NVIDIA's runtime)."""
    services = COMPOSE["services"]
    gpu, cpu = services["worker"], services["worker-cpu"]
    assert gpu["profiles"] == ["gpu"] and gpu["build"]["target"] == "worker-gpu"
    assert cpu["profiles"] == ["cpu"] and cpu["build"]["target"] == "worker-cpu"
    assert "deploy" not in cpu
    assert services["api"]["build"]["target"] == "api"
    for name in ("postgres", "redis", "api"):  # in every profile
        assert "profiles" not in services[name]
    for service in services.values():  # every target built exists in the Dockerfile
        if "build" in service:
            assert service["build"]["target"] in stages_by_name()


def test_the_cpu_profile_has_two_workers_for_replicas() -> None:
    """A worker container restarted with its engines is not adopted (docs/operations.md):
    replicas on two workers keep serving, so the cpu profile runs two, each under its own name
    (two with one name would share a queue)."""
    services = COMPOSE["services"]
    first, second = services["worker-cpu"], services["worker-cpu-2"]
    assert first["profiles"] == second["profiles"] == ["cpu"]
    assert first["build"] == second["build"] and first["command"] == second["command"]
    names = {s["environment"]["SPECDECK_WORKER_NAME"] for s in (first, second)}
    assert len(names) == 2, names
    assert "worker-cpu-2" in (ROOT / "docs" / "operations.md").read_text()


def test_the_makefile_uses_the_same_cli() -> None:
    makefile = (ROOT / "Makefile").read_text()
    # `specdeck run` migrates, then starts API_COMMAND and WORKER_COMMAND (tests/e2e checks
    # the processes it starts).
    assert "$(BIN)/specdeck run" in makefile


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's stages, each a list of (INSTRUCTION, arguments)."""
    stages: list[list[tuple[str, str]]] = []
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())  # continued lines joined
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            instruction, _, arguments = line.strip().partition(" ")
            if instruction.upper() == "FROM":
                stages.append([])
            stages[-1].append((instruction.upper(), arguments))
    return stages


def stages_by_name() -> dict[str, list[tuple[str, str]]]:
    return {stage[0][1].partition(" AS ")[2]: stage for stage in dockerfile_stages()}


def runs(stage: str) -> str:
    """Every RUN of a stage and of the stages it is built FROM, in order."""
    stages = stages_by_name()
    base = stages[stage][0][1].partition(" AS ")[0]
    own = " && ".join(arguments for instruction, arguments in stages[stage] if instruction == "RUN")
    return (runs(base) + " && " if base in stages else "") + own


def pinned(path: str) -> dict[str, str]:
    """The exact pins (``name==version``) of a requirements file."""
    found = {}
    for line in (ROOT / path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            found[requirement.name] = str(requirement.specifier)
    return found


def test_the_gpu_worker_installs_vllm_speculators_and_specdeck_at_the_pins() -> None:
    """The pins live in requirements/ only: the image installs the files, never a version."""
    assert re.fullmatch(r"==0\.33\.\d+", pinned("requirements/vllm.txt")["vllm"])
    assert pinned("requirements/speculators.txt") == {"speculators": "==0.9.0",
                                                       "hs-connectors": "==0.9.0"}
    installs = runs("worker-gpu")
    assert "pip install --no-cache-dir \"$(grep -oE '^vllm==[^ ]+' requirements/vllm.txt)\"" in installs
    assert "--no-deps -r requirements/speculators.txt" in installs
    assert "-e '.[local]'" in installs
    assert not re.search(r"(vllm|speculators|hs-connectors|torch)[=<>~]=\d", installs)
    # speculators' dependencies are held to vLLM's stack; local.txt's CPU torch is left out.
    assert "grep -v '^torch==' requirements/local.txt" in installs


def test_the_cpu_worker_is_the_local_runtime_as_make_install_sets_it_up() -> None:
    assert "make install PIP_TORCH_ARGS=\"--index-url https://download.pytorch.org/whl/cpu\"" in (
        runs("worker-cpu"))


def test_the_api_image_installs_no_torch() -> None:
    installs = runs("api")
    assert "make install" not in installs and "torch" not in installs
    assert "[local" not in installs and "-e ." in installs
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    heavy = {"torch", "transformers", "datasets", "safetensors", "tokenizers", "speculators",
             "vllm"}
    assert not heavy & {Requirement(r).name for r in project["dependencies"]}


def test_the_api_imports_no_torch() -> None:
    """The API image has no torch or transformers: the app, its routes and its OpenAPI document
    must build with them absent (here they are installed, so a finder refuses them)."""
    script = """
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"torch", "transformers", "datasets", "safetensors",
                                  "tokenizers", "speculators", "vllm"}:
            raise ImportError(f"{name} is not in the api image")
sys.meta_path.insert(0, Refuse())
from app.main import create_app
assert create_app().openapi()["paths"]
"""
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, capture_output=True,
                   env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})


def test_the_image_builds_the_dashboard_in_a_node_stage() -> None:
    stages = stages_by_name()
    node, final = stages["dashboard"], stages["api"]
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
    source_stage = stages["source"]
    app_dir = Path(next(arguments for instruction, arguments in source_stage
                        if instruction == "WORKDIR"))
    assert ["app", "./app"] in [arguments.split() for instruction, arguments in source_stage
                                if instruction == "COPY"]
    assert app_dir / target == app_dir / default.relative_to(REPOSITORY)


def test_the_node_stage_leaves_a_dist_folder_with_no_frontend_to_build(tmp_path: Path) -> None:
    """COPY --from fails on a folder that is not there: with no package.json yet, the stage's
    RUN (run here by sh, in a copy of frontend/) still leaves an empty dist/."""
    (build,) = [arguments for instruction, arguments in stages_by_name()["dashboard"]
                if instruction == "RUN"]
    frontend = tmp_path / "frontend"
    shutil.copytree(ROOT / "frontend", frontend, ignore=shutil.ignore_patterns(
        "package.json", "node_modules", "dist"))
    subprocess.run(["sh", "-c", build], cwd=frontend, check=True, env={"PATH": "/usr/bin:/bin"})
    assert (frontend / "dist").is_dir() and not list((frontend / "dist").iterdir())
