"""The suite's one way to wait: poll a condition until it holds, up to a deadline the caller
gives (generous: a loaded 2-core machine is slow), and fail naming what never happened."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# The pause between two checks starts short and grows by half each time, up to MOST: a
# condition that holds within a second is seen within a tick, and a wait of minutes (a
# training, an engine's start) checks twice a second, not twenty times. A check is no free
# read: most ask the in-process API, or scan every process's environment, on the 2 cores the
# engines and trainers under test need (docs/testing.md, "Waiting costs CPU").
MOST = 0.5


def wait_for(check: Callable[[], T], timeout: float = 60.0, what: str = "a condition",
             every: float = 0.05, most: float = MOST) -> T:
    """Call ``check`` until it returns something true, and return that. The pauses start at
    ``every`` s and grow to ``most`` s; a condition that holds only for a moment (a request in
    flight) is checked at a steady pace: ``most=every``."""
    deadline = time.monotonic() + timeout
    pause = every
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(pause)
        pause = min(pause * 1.5, most)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
