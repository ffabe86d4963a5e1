"""The summary line a wait ends with, and its progress line."""

from __future__ import annotations

from app.client.wait import job_summary, progress_text


def test_summary_line() -> None:
    job = {"id": "job_1", "status": "succeeded", "error_code": None,
           "served_acceptance_length": 3.4567, "evaluation": {"checkpoint_id": "ckpt_2",
                                                              "speedup": 1.874}}
    checkpoints = [{"id": "ckpt_1", "is_best": True, "hub_url": None},
                   {"id": "ckpt_2", "is_best": False, "hub_url": "https://hf.co/o/n"}]
    assert job_summary(job, checkpoints) == ("job_1 succeeded: served AL 3.46, speedup 1.87x, "
                                             "best checkpoint ckpt_2, published https://hf.co/o/n")
    slower = {**job, "verdict": {"code": "slower_than_no_speculation",
                                  "summary": "slower than no speculation", "message": "..."}}
    assert job_summary(slower, checkpoints).startswith(
        "job_1 succeeded: served AL 3.46, speedup 1.87x (slower than no speculation), ")
    failed = {**job, "status": "failed", "error_code": "acceptance_gate_failed",
              "served_acceptance_length": None, "evaluation": None}
    assert job_summary(failed, checkpoints[:1]) == (
        "job_1 failed (acceptance_gate_failed): served AL -, speedup -, best checkpoint ckpt_1")


def test_progress_counts_steps_of_the_total_once_it_is_known() -> None:
    job = {"status": "running", "stage": "training",
           "progress": {"epoch": 1, "epochs": 2, "step": 11, "steps_done": 12,
                        "total_steps": None, "percent": None, "eta_seconds": None}}
    assert progress_text(job, 1.5) == "running/training epoch 1/2, step 12, loss 1.5"
    job["progress"] |= {"epoch": 2, "step": 40, "steps_done": 41, "total_steps": 62,
                        "percent": 66.1, "eta_seconds": 21.4}
    assert progress_text(job, None) == ("running/training epoch 2/2, step 41 of 62 (66.1%), "
                                        "about 21 s left")
    assert progress_text({**job, "status": "succeeded", "stage": None}, None) == "succeeded"


def test_progress_of_the_evaluation_counts_its_own_steps() -> None:
    trained = {"epoch": 2, "epochs": 2, "step": 61, "steps_done": 62, "total_steps": 62,
               "percent": 100.0, "eta_seconds": 0.0}
    job = {"status": "running", "stage": "evaluating", "progress": trained,
           "stage_progress": {"stage": "evaluating", "what": "the trained drafter: prompt 3 of 8 "
                              "done", "steps_done": 4, "total_steps": 27, "percent": 14.8,
                              "eta_seconds": 52.3}}
    assert progress_text(job, None) == ("running/evaluating the trained drafter: prompt 3 of 8 "
                                        "done, step 4 of 27 (14.8%), about 52 s left")
    # A stage's progress is shown during that stage only (then the training's again).
    assert progress_text({**job, "stage": "publishing"}, None) == (
        "running/publishing epoch 2/2, step 62 of 62 (100%)")


def test_the_terminal_bar_counts_the_evaluations_steps_while_it_runs() -> None:
    from app.client.wait import LiveView

    view = LiveView("job_1")
    trained = {"epoch": 2, "epochs": 2, "step": 61, "steps_done": 62, "total_steps": 62,
               "percent": 100.0, "eta_seconds": 0.0}
    job = {"status": "running", "stage": "training", "progress": {**trained, "epoch": 1}}
    view.update(job, None)
    [task] = view.progress.tasks
    assert (task.total, task.completed) == (2, 0)  # epochs, during the first
    job = {"status": "running", "stage": "evaluating", "progress": trained,
           "stage_progress": {"stage": "evaluating", "what": "the trained drafter: serving 8 "
                              "held-out prompts", "steps_done": 1, "total_steps": 9,
                              "percent": 11.1, "eta_seconds": None}}
    view.update(job, None)
    [task] = view.progress.tasks
    assert (task.total, task.completed) == (9, 1)
    assert task.fields["detail"].startswith("the trained drafter: serving 8 held-out prompts")
