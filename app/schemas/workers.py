from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel


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
