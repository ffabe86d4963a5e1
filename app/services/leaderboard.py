"""The ranking of a bake-off's candidates by what serving showed.

Served speedup decides, measured in rounds so that the machine's load cannot pick the winner:
each candidate's speedup is the median of its rounds, and its spread the range of them. A lead
smaller than the spread (of either candidate) is a tie, which the served acceptance length
breaks, then the training cost; without speeds (no baseline measured) acceptance decides. Only a lossless candidate that passes the acceptance gate can
win; the others are ranked after the eligible ones, the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    name: str
    speedup: float | None  # the median over the rounds
    spread: float  # the highest round's speedup minus the lowest's
    served_al: float | None
    cost: float | None  # the training's CPU (or GPU, or wall) seconds
    eligible: bool  # lossless, and passes the gate


@dataclass(frozen=True)
class Standing:
    ranking: list[str]  # best first
    winner: str | None  # the first, when it is eligible
    ties: dict[str, list[str]]  # each candidate's ties (a lead within the spread)


def tied(a: Entry, b: Entry) -> bool:
    """Whether neither leads the other by more than the spread of either. Two speeds not
    measured (an evaluation without the no-speculation baseline) tie: acceptance decides."""
    if a.speedup is None or b.speedup is None:
        return a.speedup is None and b.speedup is None
    return abs(a.speedup - b.speedup) <= max(a.spread, b.spread)


def _tie_break(entry: Entry) -> tuple[float, float, str]:
    return (-(entry.served_al or 0.0), entry.cost if entry.cost is not None else math.inf,
            entry.name)


def rank(entries: list[Entry]) -> Standing:
    """The eligible candidates, then the others, each group fastest first: the next place goes
    to the fastest left, or to whichever of those it ties with has the higher acceptance length
    (then the lower cost)."""
    ranking: list[Entry] = []
    for eligible in (True, False):
        pool = [e for e in entries if e.eligible == eligible]
        while pool:
            fastest = max(pool, key=lambda e: -math.inf if e.speedup is None else e.speedup)
            best = min([e for e in pool if e is fastest or tied(fastest, e)], key=_tie_break)
            ranking.append(best)
            pool.remove(best)
    ties = {e.name: [o.name for o in entries if o is not e and tied(e, o)] for e in entries}
    winner = ranking[0].name if ranking and ranking[0].eligible else None
    return Standing([e.name for e in ranking], winner, ties)
