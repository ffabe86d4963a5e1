"""The bake-off's ranking (app/services/leaderboard.py): served speedup decides; a lead smaller
than the spread is a tie, broken by the served acceptance length, then the training cost; only a
lossless candidate that passes the gate can win."""

from __future__ import annotations

from app.services.leaderboard import Entry, rank


def entry(name: str, speedup: float | None, spread: float = 0.0, al: float | None = 2.0,
          cost: float | None = 100.0, eligible: bool = True) -> Entry:
    return Entry(name, speedup, spread, al, cost, eligible)


def test_the_fastest_wins_when_it_leads_by_more_than_the_spread() -> None:
    standing = rank([entry("slow", 1.5, 0.1), entry("fast", 2.4, 0.2), entry("mid", 2.0, 0.1)])
    assert standing.ranking == ["fast", "mid", "slow"] and standing.winner == "fast"
    assert standing.ties == {"slow": [], "fast": [], "mid": []}


def test_a_lead_within_the_spread_is_a_tie_broken_by_acceptance_then_cost() -> None:
    # fast leads by 0.1, less than its spread (0.3): a tie, and tied's higher AL wins it.
    standing = rank([entry("fast", 2.5, 0.3, al=3.0), entry("tied", 2.4, 0.05, al=4.0)])
    assert standing.winner == "tied" and standing.ranking == ["tied", "fast"]
    assert standing.ties == {"fast": ["tied"], "tied": ["fast"]}
    # The same acceptance length: the cheaper training wins.
    cheaper = rank([entry("a", 2.5, 0.3, al=3.0, cost=200.0), entry("b", 2.4, 0.1, al=3.0, cost=50.0)])
    assert cheaper.winner == "b"
    # The same speedup with no spread at all is a tie too.
    assert rank([entry("x", 2.0, al=1.5), entry("y", 2.0, al=1.9)]).winner == "y"


def test_only_an_eligible_candidate_can_win() -> None:
    """Not lossless or below the gate: ranked after every eligible one, however fast."""
    standing = rank([entry("lossy", 3.0, eligible=False), entry("honest", 1.2)])
    assert standing.ranking == ["honest", "lossy"] and standing.winner == "honest"
    none = rank([entry("lossy", 3.0, eligible=False), entry("slow", 0.8, eligible=False)])
    assert none.winner is None and none.ranking == ["lossy", "slow"]


def test_a_candidate_without_a_speedup_ranks_after_the_measured_ones() -> None:
    standing = rank([entry("unmeasured", None, al=5.0), entry("measured", 1.1)])
    assert standing.ranking == ["measured", "unmeasured"]
    assert standing.ties == {"unmeasured": [], "measured": []}
    assert rank([]).winner is None and rank([]).ranking == []


def test_without_the_no_speculation_baseline_acceptance_decides() -> None:
    """evaluate.baseline false measures no speedup: the highest served acceptance length wins,
    not the first candidate named."""
    standing = rank([entry("a", None, al=1.2), entry("b", None, al=2.5), entry("c", None, al=1.8)])
    assert standing.ranking == ["b", "c", "a"] and standing.winner == "b"
