"""What scripts/check-vllm-cli.sh recorded for the pinned vLLM (tests/data/vllm_cli/): the
record itself and its argument sets, for the tests that hold our builders and the doctor's flag
check to it."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from app.doctor.flags import ArgumentSet

ROOT = Path(__file__).resolve().parents[2]
RECORD_DIR = ROOT / "tests" / "data" / "vllm_cli"


def pinned_vllm() -> str:
    """The vLLM version requirements/vllm.txt pins for GPU hosts (its one ``vllm==`` line)."""
    text = (ROOT / "requirements" / "vllm.txt").read_text()
    return re.search(r"^vllm==([^\s#]+)", text, re.MULTILINE).group(1)


@cache
def record() -> dict[str, Any]:
    """The record of the pinned vLLM; a moved pin without a new record is an error that says
    how to make one."""
    path = RECORD_DIR / f"vllm-{pinned_vllm()}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no record for the pinned vLLM at {path}: "
                                "run scripts/check-vllm-cli.sh (docs/gpu.md)")
    return json.loads(path.read_text())


def argument_sets() -> dict[str, ArgumentSet]:
    """The recorded argument sets, by program (``vllm serve``, ``speculators train``, ...)."""
    return {name: ArgumentSet.from_json(data)
            for name, data in record()["argument_sets"].items()}
