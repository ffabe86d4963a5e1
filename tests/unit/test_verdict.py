"""The verdict of a served evaluation (app/schemas/jobs.py): a drafter slower than no
speculation, or no better than n-gram drafting, is flagged on its job and checkpoints."""

from __future__ import annotations

from datetime import datetime, timezone

from app.schemas.jobs import CheckpointOut, verdict_of


def test_slower_than_no_speculation_comes_first_and_names_both_speedups() -> None:
    verdict = verdict_of({"speedup": 0.61, "ngram_speedup": 0.89, "beats_ngram": False})
    assert verdict is not None and verdict.code == "slower_than_no_speculation"
    assert verdict.summary == "slower than no speculation"
    assert "×0.61 the output tokens/s of the verifier alone; n-gram drafting: ×0.89" in verdict.message
    assert "n-gram" not in verdict_of({"speedup": 0.999}).message


def test_below_ngram_by_acceptance_or_by_speed() -> None:
    by_length = verdict_of({"speedup": 1.4, "beats_ngram": False, "mean_acceptance_length": 1.4,
                            "ngram_mean_acceptance_length": 1.9})
    assert by_length is not None and by_length.code == "below_ngram"
    assert by_length.message.endswith("served acceptance length 1.40 against n-gram's 1.90.")
    by_speed = verdict_of({"speedup": 1.2, "ngram_speedup": 1.3, "beats_ngram": True,
                           "mean_acceptance_length": 1.6, "ngram_mean_acceptance_length": 1.1})
    assert by_speed is not None and by_speed.code == "below_ngram"
    # Speed decided, so the message quotes the speeds (its acceptance beat n-gram's).
    assert by_speed.message.endswith("(prompt lookup, no training): ×1.20 the output tokens/s of "
                                     "the verifier alone, against n-gram's ×1.30.")


def test_a_lead_within_the_rounds_spread_is_no_verdict() -> None:
    """The speedup is the median of the evaluation's rounds: a gap smaller than their spread
    is a tie, not a finding."""
    assert verdict_of({"speedup": 1.01, "ngram_speedup": 1.02, "speedup_spread": 0.35,
                       "beats_ngram": True}) is None
    assert verdict_of({"speedup": 0.9, "speedup_spread": 0.2}) is None
    assert verdict_of({"speedup": 0.7, "speedup_spread": 0.2}).code == "slower_than_no_speculation"
    assert verdict_of({"speedup": 1.01, "ngram_speedup": 1.5, "speedup_spread": 0.35,
                       "beats_ngram": True}).code == "below_ngram"


def test_no_verdict_for_a_drafter_that_pays_off_or_was_not_compared() -> None:
    assert verdict_of({"speedup": 1.0, "ngram_speedup": 0.9, "beats_ngram": True}) is None
    assert verdict_of({"mean_acceptance_length": 3.2}) is None  # baselines unticked
    assert verdict_of({}) is None and verdict_of(None) is None


def test_a_checkpoint_carries_its_verdict_in_the_api_shape() -> None:
    out = CheckpointOut(id="ckpt_1", job_id="job_1", epoch=0, served_acceptance_length=1.4,
                        evaluation={"speedup": 0.5}, path="/w", metrics=None, is_best=True,
                        partial=False, created_at=datetime.now(timezone.utc),
                        publish_status=None,
                        publish_error=None, hub_repo=None, hub_commit=None, hub_url=None,
                        published_at=None)
    assert out.model_dump(mode="json")["verdict"]["code"] == "slower_than_no_speculation"
    assert CheckpointOut(**{**out.model_dump(exclude={"verdict"}), "evaluation": None}).verdict is None
