"""One row of the doctor's table."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    """``ok`` is None when the check does not apply (or could not run) on this host;
    ``required`` marks what the runtime cannot work without: a required check that is not ok
    makes the doctor exit non-zero."""

    group: str      # "versions", "gpus", "flags", "disk", "services"
    name: str
    ok: bool | None
    detail: str
    required: bool = True
