"""The CPU time a trainer process used, as it prints it when it exits (the trainer wrapper,
workers/runtimes/local/train.py) and as the worker reads it from the trainer's output: a bake-off
ranks its candidates' training cost by it. Each process of a torchrun prints its own line, and
the worker adds them up; a process that is killed prints none."""

from __future__ import annotations

import re
import resource

CPU_SECONDS_LINE = re.compile(r"specdeck: trainer process used ([0-9]+(?:\.[0-9]+)?) CPU seconds")


def cpu_seconds_line() -> str:
    """This process's CPU time (user and system) and its waited-for children's, as the line
    ``CPU_SECONDS_LINE`` reads."""
    used = sum(getattr(resource.getrusage(who), field) for who in
               (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN) for field in ("ru_utime", "ru_stime"))
    return f"specdeck: trainer process used {used:.3f} CPU seconds"
