"""The training pipeline, stage by stage."""

from __future__ import annotations

from workers.runner import PipelineStage

PIPELINE: list[PipelineStage] = []
