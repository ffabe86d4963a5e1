"""scripts/drop_requirements.py, which `make install` runs on speculators' wheel: on a wheel
made here, then installed by pip into a folder of its own, whose metadata is read back."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "scripts" / "drop_requirements.py"
METADATA = """Metadata-Version: 2.4
Name: demo-pkg
Version: 1.0
Requires-Dist: torch<=2.14.1,>=2.9.0
Requires-Dist: torchaudio
Requires-Dist: torchvision
Requires-Dist: pytest~=9.1.1; extra == "dev"

A package.
"""


def make_wheel(directory: Path) -> Path:
    wheel = directory / "demo_pkg-1.0-py3-none-any.whl"
    info = "demo_pkg-1.0.dist-info"
    files = {"demo_pkg/__init__.py": "VALUE = 1\n", f"{info}/METADATA": METADATA,
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
        archive.writestr(f"{info}/RECORD", "".join(f"{name},,\n" for name in files)
                         + f"{info}/RECORD,,\n")
    return wheel


def test_the_copy_requires_all_but_the_named_and_installs(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), str(make_wheel(tmp_path)),
                          str(tmp_path / "own"), "torchvision", "TorchAudio"],
                         capture_output=True, text=True, check=True).stdout.strip()
    copy = Path(out)
    assert copy.parent == tmp_path / "own" and copy.name == "demo_pkg-1.0-py3-none-any.whl"
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--target", str(target), str(copy)], check=True)
    installed = metadata.Distribution.at(target / "demo_pkg-1.0.dist-info")
    assert installed.requires == ["torch<=2.14.1,>=2.9.0", 'pytest~=9.1.1; extra == "dev"']
    with zipfile.ZipFile(copy) as archive:
        assert archive.read("demo_pkg/__init__.py") == b"VALUE = 1\n"


def test_a_name_the_wheel_does_not_require_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(subprocess.CalledProcessError) as failed:
        subprocess.run([sys.executable, str(SCRIPT), str(make_wheel(tmp_path)),
                        str(tmp_path / "own"), "torchvision", "numpy"],
                       capture_output=True, text=True, check=True)
    assert "does not require each of ['numpy', 'torchvision']" in failed.value.stderr
