"""The training pipeline, in order. Each stage skips work whose output is already valid."""

from __future__ import annotations

from app.schemas.job_spec import JobSpec
from app.services.state import Stage
from workers.pipeline.data import prepare_data
from workers.pipeline.deploy import deploy
from workers.pipeline.evaluate import evaluate
from workers.pipeline.gate import check_gate
from workers.pipeline.publishing import publish
from workers.pipeline.regenerate import regenerate
from workers.pipeline.training import train
from workers.pipeline.verifier import start_verifier
from workers.runner import JobContext, PipelineStage


def evaluate_and_gate(ctx: JobContext[JobSpec]) -> None:
    evaluate(ctx)
    check_gate(ctx)


PIPELINE: list[PipelineStage] = [
    PipelineStage(Stage.REGENERATING_DATA, regenerate, when=lambda spec: spec.data.regenerate),
    PipelineStage(Stage.STARTING_VERIFIER, start_verifier),
    PipelineStage(Stage.PREPARING_DATA, prepare_data),
    PipelineStage(Stage.TRAINING, train),
    PipelineStage(Stage.EVALUATING, evaluate_and_gate, when=lambda spec: spec.evaluate is not None),
    PipelineStage(Stage.PUBLISHING, publish, when=lambda spec: bool(spec.publish)),
    PipelineStage(Stage.DEPLOYING, deploy, when=lambda spec: spec.deploy is not None),
]
