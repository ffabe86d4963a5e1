"""The training pipeline, in order. Each stage skips work whose output is already valid."""

from __future__ import annotations

from app.services.state import Stage
from workers.pipeline.data import prepare_data
from workers.pipeline.evaluate import evaluate
from workers.pipeline.publishing import publish
from workers.pipeline.training import train
from workers.pipeline.verifier import start_verifier
from workers.runner import PipelineStage
from workers.runtimes import evaluation_settings

PIPELINE: list[PipelineStage] = [
    PipelineStage(Stage.STARTING_VERIFIER, start_verifier),
    PipelineStage(Stage.PREPARING_DATA, prepare_data),
    PipelineStage(Stage.TRAINING, train),
    PipelineStage(Stage.EVALUATING, evaluate, when=lambda spec: evaluation_settings(spec) is not None),
    PipelineStage(Stage.PUBLISHING, publish, when=lambda spec: bool(spec.get("publish"))),
]
