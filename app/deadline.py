"""A deadline moved forward often (a connection's keep-alive, a read timeout), kept by one timer.

Making a timer for each request and cancelling it at the next one (what uvicorn does for its
keep-alive, and what the gateway's upstream client did for each wait) costs a libuv handle
made, started, stopped and closed each time on uvloop. A ``Deadline`` arms its timer when none
is armed, and when the timer fires and finds the deadline moved on, arms it again for the new
one: a busy connection's timer fires once per timeout period (docs/benchmarks.md, "Timers").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

EARLY = 0.001  # seconds: a timer may fire a little before its time


class Deadline:
    """Calls ``expire()`` once the deadline set with ``set`` has passed, unless ``clear`` came
    first (or ``set`` moved it later)."""

    __slots__ = ("loop", "expire", "when", "timer")

    def __init__(self, loop: asyncio.AbstractEventLoop, expire: Callable[[], None]) -> None:
        self.loop, self.expire = loop, expire
        self.when: float | None = None
        self.timer: asyncio.TimerHandle | None = None

    def set(self, seconds: float) -> None:
        """The deadline is ``seconds`` from now."""
        self.when = when = self.loop.time() + seconds
        timer = self.timer
        if timer is None or timer.when() > when:
            if timer is not None:
                timer.cancel()
            self.timer = self.loop.call_at(when, self._check)

    def clear(self) -> None:
        self.when = None  # the timer, if armed, finds nothing due and is not armed again

    def cancel(self) -> None:
        self.when = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _check(self) -> None:
        self.timer = None
        when = self.when
        if when is None:
            return  # cleared: the next ``set`` arms the timer again
        if self.loop.time() >= when - EARLY:
            self.when = None
            self.expire()
        else:
            self.timer = self.loop.call_at(when, self._check)
