"""The suite's one way to wait: poll a condition until it holds, up to a deadline the caller
gives (generous: a loaded 2-core machine is slow), and fail naming what never happened."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout: float = 60.0, what: str = "a condition",
             every: float = 0.05) -> T:
    """Call ``check`` every ``every`` s until it returns something true, and return that."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
