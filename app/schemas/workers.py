from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field


class RunningOut(BaseModel):
    """A job or deployment placed on a worker, and the GPUs (or local-runtime slots) it holds.
    Another project's work shows only as busy: no id, no name."""

    kind: Literal["job", "deployment"]
    id: str | None = Field(description="Null for another project's work")
    name: str | None = Field(description="A deployment's served name; null for a job and for "
                             "another project's work")
    replica: int | None = Field(None, description="Which of the deployment's replicas (0: its "
                                "own row); null for a job and for another project's work")
    status: str = Field(description="The job's or deployment's status (a replica's own); "
                        "\"busy\" for another project's work")
    gpus: list[int] = Field(description="The GPU indices it holds (vllm runtime)")
    slots: list[int] = Field(description="The training slot (a job) or serving slot (a "
                             "deployment) it holds (local runtime)")


class WorkerOut(BaseModel):
    object: Literal["specdeck.worker"] = "specdeck.worker"
    id: str
    host: str
    queue: str
    gpus: list[dict[str, Any]]
    capacity: int  # training slots: local-runtime jobs at once
    serving_slots: int  # local-runtime deployments at once
    started_at: datetime
    last_heartbeat_at: datetime
    alive: bool
    running: list[RunningOut] = Field(description="What is placed on this worker now, oldest "
                                      "first")
