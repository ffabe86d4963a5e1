"""The doctor's flag check (app/doctor/flags.py) against the vLLM and speculators argument sets
recorded with their own parsers (tests/data/vllm_cli/), and live against the speculators this
venv has."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.doctor import flags
from app.doctor.flags import (
    SPECULATORS_TRAIN,
    VLLM_SERVE,
    ArgumentSet,
    Unavailable,
    check_commands,
    flag_checks,
    installed_argument_sets,
    program_of,
    representative_job,
    specdeck_commands,
)
from tests.support.vllm_cli_record import ROOT, argument_sets, record


def recorded() -> dict[str, dict[str, ArgumentSet]]:
    """The recorded sets as the doctor reads installed ones: by package, then program."""
    by_package: dict[str, dict[str, ArgumentSet]] = {}
    for program, accepted in argument_sets().items():
        by_package.setdefault(accepted.package, {})[program] = accepted
    return by_package


def without(package_sets: dict[str, ArgumentSet], program: str, option: str
            ) -> dict[str, ArgumentSet]:
    accepted = package_sets[program]
    return {**package_sets, program: dataclasses.replace(accepted,
                                                         options=accepted.options - {option})}


@pytest.mark.parametrize("runtime", ["vllm", "local"])
def test_every_command_passes_against_the_recorded_versions(runtime: str) -> None:
    commands = specdeck_commands(representative_job(runtime))
    if runtime == "local":  # its vLLM is the CPU wheel, not the recorded GPU pin: checked live
        commands = {name: argv for name, argv in commands.items()
                    if (program_of(argv) or ("",))[0] != VLLM_SERVE}
    rows = check_commands(commands, recorded())
    outside = {name for name, argv in commands.items() if program_of(argv) is not None}
    assert {row.name for row in rows} == outside
    assert all(row.group == "flags" and row.ok is True and row.required for row in rows), rows
    versions = record()["versions"]
    assert any(f"vllm {versions['vllm']}" in row.detail for row in rows) == (runtime == "vllm")


def test_the_local_runtimes_vllm_commands_are_checked_as_vllm_serve() -> None:
    """The local runtime runs vLLM's CPU wheel through its API server module, which takes
    `vllm serve`'s flags (its CPU connector loaded from a module path, not vLLM's registry): the
    hidden-states server, the regeneration server and every serving engine."""
    commands = specdeck_commands(representative_job("local"))
    programs = {name: program_of(argv)[0] for name, argv in commands.items() if program_of(argv)}
    assert set(programs.values()) == {VLLM_SERVE, SPECULATORS_TRAIN, "speculators prepare-data",
                                      "speculators generate-offline-data",
                                      "speculators regenerate-responses"}
    assert [name for name, program in programs.items() if program == VLLM_SERVE] == [
        "regenerating_data: vLLM without speculative decoding (CPU), generating the verifier's "
        "own replies",
        "starting_verifier: vLLM server that extracts hidden states (CPU)",
        "serving: vLLM with the DFlash drafter (CPU), evaluating the trained drafter",
        "serving: vLLM with n-gram (prompt lookup) drafting (CPU), the n-gram (prompt lookup) "
        "baseline",
        "serving: vLLM without speculative decoding (CPU), the no-speculation baseline",
    ]


def test_a_flag_the_installed_version_lacks_fails_its_rows() -> None:
    sets = recorded()
    sets["vllm"] = without(sets["vllm"], VLLM_SERVE, "--per-request-spec-decode-metrics")
    sets["speculators"] = without(sets["speculators"], SPECULATORS_TRAIN, "--max-anchors")
    rows = {row.name: row for row in check_commands(
        specdeck_commands(representative_job("vllm")), sets)}
    failed = {name for name, row in rows.items() if row.ok is False}
    assert failed == {
        "serving: vLLM with the DFlash drafter, evaluating the trained drafter",
        "serving: vLLM with n-gram (prompt lookup) drafting, the n-gram (prompt lookup) baseline",
        "training: speculators trainer under torchrun",
        "training: warm start",
    }
    assert "--per-request-spec-decode-metrics is not an option of vllm serve" in rows[
        "serving: vLLM with the DFlash drafter, evaluating the trained drafter"].detail
    assert "--max-anchors" in rows["training: warm start"].detail


def test_a_speculative_method_the_installed_vllm_lacks_fails() -> None:
    sets = recorded()
    accepted = sets["vllm"][VLLM_SERVE]
    option = accepted.json_options["--speculative-config"]
    methods = option.choices["method"] - {"dflash"}
    sets["vllm"] = {VLLM_SERVE: dataclasses.replace(accepted, json_options={
        **accepted.json_options,
        "--speculative-config": dataclasses.replace(option, choices={"method": methods})})}
    rows = check_commands(specdeck_commands(representative_job("vllm")), sets)
    failed = [row for row in rows if row.ok is False]
    assert {row.name for row in failed} == {
        "serving: vLLM with the DFlash drafter, evaluating the trained drafter",
        "model card: vllm serve"}
    assert all("method='dflash'" in row.detail for row in failed)


@pytest.mark.parametrize(("unavailable", "ok"), [
    (Unavailable("vllm is not installed", installed=False), None),
    (Unavailable("vllm's parsers could not be read: ImportError: x", installed=True), False),
])
def test_a_package_that_cannot_be_read_gives_its_reason(unavailable: Unavailable,
                                                        ok: bool | None) -> None:
    sets = {**recorded(), "vllm": unavailable}
    rows = check_commands(specdeck_commands(representative_job("vllm")), sets)
    vllm_rows = [row for row in rows if row.detail == unavailable.reason]
    assert vllm_rows and all(row.ok is ok and row.required for row in vllm_rows)
    assert all(row.ok is True for row in rows if row not in vllm_rows)


def test_a_missing_speculators_command_is_reported() -> None:
    sets = recorded()
    sets["speculators"] = {k: v for k, v in sets["speculators"].items()
                           if k != "speculators generate-offline-data"}
    rows = check_commands(specdeck_commands(representative_job("vllm")), sets)
    row = next(r for r in rows if r.name == "preparing_data: speculators generate-offline-data")
    assert row.ok is False and "does not exist" in row.detail


def test_live_check_reads_the_installed_parsers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The speculators rows pass against the installed speculators' own parsers, and the vLLM
    rows against the installed vLLM's (here the CPU wheel); where vLLM is not installed its
    rows say so and are neither passed nor failed."""
    monkeypatch.setenv("SPECDECK_DOCTOR_CACHE", "off")  # the parsers themselves, not a copy
    for runtime in ("vllm", "local"):
        rows = {row.name: row for row in flag_checks(runtime)}
        vllm_rows = {name for name, argv in specdeck_commands(representative_job(runtime)).items()
                     if program_of(argv) and program_of(argv)[0] == VLLM_SERVE}
        vllm_ok = None if importlib.util.find_spec("vllm") is None else True
        assert vllm_rows and all(rows[name].ok is vllm_ok for name in vllm_rows), rows
        if vllm_ok is None:
            assert all(rows[name].detail == "vllm is not installed" for name in vllm_rows)
        assert all(row.ok is True for name, row in rows.items() if name not in vllm_rows), rows


def test_importing_the_check_imports_neither_vllm_nor_speculators() -> None:
    code = ("import sys, app.doctor.flags; "
            "print(sorted(m for m in ('vllm', 'speculators', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_what_was_read_is_kept_until_the_package_is_installed_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The parsers cost seconds of imports: a second doctor run reads what the first kept, and
    a reinstall (the package's files written again) reads them anew."""
    package = tmp_path / "site" / "fakeprog"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    reads = []
    options = [frozenset({"--a"})]

    def reader() -> dict[str, ArgumentSet]:
        reads.append(1)
        return {"fakeprog run": ArgumentSet("fakeprog run", "fakeprog", "1.0", options[0])}

    monkeypatch.setitem(flags.READERS, "fakeprog", reader)
    cache = tmp_path / "cache"
    first = installed_argument_sets("fakeprog", cache)
    assert installed_argument_sets("fakeprog", cache) == first and len(reads) == 1
    assert len(list(cache.iterdir())) == 1
    options[0] = frozenset({"--a", "--b"})  # a new version, installed over the old one
    stat = (package / "__init__.py").stat()
    os.utime(package / "__init__.py", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    second = installed_argument_sets("fakeprog", cache)
    assert len(reads) == 2 and second["fakeprog run"].options == {"--a", "--b"}
    monkeypatch.setenv("SPECDECK_DOCTOR_CACHE", "off")
    installed_argument_sets("fakeprog")
    assert len(reads) == 3
