"""Schemathesis hooks for tests/integration/test_schemathesis.py (loaded by SCHEMATHESIS_HOOKS).

Schemathesis infers a link from ``GET /api/keys`` to ``DELETE /api/keys/{key_id}``, so its
stateful phase revokes keys it finds listed, and the key it authenticates with is listed too.
Revoking that one would turn every later request into a 401 and end the run's coverage there:
a decoy key of the same project is revoked in its place (a real key, answering 200 as well).
"""

from __future__ import annotations

import os
from typing import Any

import schemathesis

FUZZER_KEY_ID = "SPECDECK_TEST_FUZZER_KEY_ID"
DECOY_KEY_ID = "SPECDECK_TEST_DECOY_KEY_ID"


@schemathesis.hook
def before_call(ctx: Any, case: Any, **kwargs: Any) -> None:
    parameters = case.path_parameters or {}
    if (case.operation.method.upper(), case.operation.path) == ("DELETE", "/api/keys/{key_id}") \
            and parameters.get("key_id") == os.environ[FUZZER_KEY_ID]:
        parameters["key_id"] = os.environ[DECOY_KEY_ID]
