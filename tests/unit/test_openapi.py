"""The OpenAPI document says what the code enforces: the error responses each route can answer
(in the one error shape), the patterns checked in code, and the deployment one-source rule.
That the server answers as declared is tests/integration/test_schemathesis.py's job."""

from __future__ import annotations

from typing import Any

import pytest

from app.dashboard import is_api_path
from app.main import create_app
from app.schemas.common import NUL_FREE
from app.schemas.jobs import HF_REPO_ID
from app.services.secrets import NAME as SECRET_NAME

ERROR = {"$ref": "#/components/schemas/ErrorResponse"}


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return create_app().openapi()


def responses(document: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    return document["paths"][path][method]["responses"]


def error_schema(response: dict[str, Any]) -> dict[str, Any]:
    return response["content"]["application/json"]["schema"]


def component(document: dict[str, Any], name: str) -> dict[str, Any]:
    return document["components"]["schemas"][name]


@pytest.mark.parametrize("method, path, statuses", [
    ("post", "/api/jobs", {"200", "201", "400", "401", "403", "413", "422", "429", "503"}),
    ("get", "/api/jobs/{job_id}", {"200", "401", "403", "404", "422", "503"}),
    ("post", "/api/jobs/{job_id}/cancel", {"200", "401", "403", "404", "409", "422", "503"}),
    ("post", "/api/deployments", {"201", "400", "401", "403", "409", "413", "422", "429", "503"}),
    ("post", "/api/datasets",
     {"200", "201", "400", "401", "403", "413", "415", "422", "429", "503"}),
    ("delete", "/api/datasets/{dataset_id}", {"204", "401", "403", "404", "409", "422", "503"}),
    ("put", "/api/secrets/{name}", {"200", "400", "401", "403", "413", "422", "503"}),
    ("get", "/api/secrets", {"200", "401", "403", "503"}),
    ("post", "/api/checkpoints/{checkpoint_id}/publish",
     {"202", "400", "401", "403", "404", "409", "413", "422", "503"}),
    ("post", "/api/jobs/plan", {"200", "400", "401", "403", "413", "422", "503"}),
    ("post", "/api/keys", {"201", "400", "401", "403", "413", "422", "429", "503"}),
    ("get", "/api/keys", {"200", "401", "403", "422", "503"}),
    ("delete", "/api/keys/{key_id}", {"200", "401", "403", "404", "409", "422", "503"}),
    ("post", "/api/verifiers/inspect", {"200", "400", "401", "403", "413", "422", "503"}),
    ("get", "/api/me", {"200", "401", "403", "503"}),
    ("get", "/api/deployments/{deployment_id}/events",
     {"200", "401", "403", "404", "422", "503"}),
    ("get", "/readyz", {"200", "503"}),
    ("post", "/v1/chat/completions",
     {"200", "400", "401", "404", "413", "429", "4XX", "502", "503", "504"}),
])
def test_each_route_declares_the_statuses_it_answers(document, method, path, statuses) -> None:
    assert set(responses(document, method, path)) == statuses


def test_every_error_is_declared_in_the_one_error_shape(document) -> None:
    errors = [(path, method, status, response)
              for path, operations in document["paths"].items()
              for method, operation in operations.items()
              for status, response in operation["responses"].items() if status[0] in "45"]
    assert len(errors) > 50
    for path, method, status, response in errors:
        assert response["content"] == {"application/json": {"schema": ERROR}}, (path, method, status)
    assert "HTTPValidationError" not in document["components"]["schemas"]
    detail = component(document, "ErrorDetail")
    assert set(detail["required"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("path", ["/api/jobs", "/api/deployments/{deployment_id}/retrain"])
def test_a_replayed_job_is_declared_200_with_its_header(document, path: str) -> None:
    created = responses(document, "post", path)
    assert error_schema(created["201"]) == error_schema(created["200"]) == {
        "$ref": "#/components/schemas/JobOut"}
    assert "Idempotent-Replayed" in created["200"]["headers"]
    assert "Retry-After" in created["429"]["headers"]
    [key] = [p for p in document["paths"][path]["post"]["parameters"] if p["in"] == "header"]
    assert key["name"] == "idempotency-key" and key["schema"]["maxLength"] == 255


def test_patterns_checked_in_code_are_in_the_schema(document) -> None:
    put = document["paths"]["/api/secrets/{name}"]["put"]
    assert put["parameters"][0]["schema"]["pattern"] == SECRET_NAME.pattern
    assert component(document, "PublishRequest")["properties"]["repo_id"]["pattern"] == \
        HF_REPO_ID.pattern
    publish = component(document, "JobCreate")["properties"]["publish"]["anyOf"]
    assert {"type": "null"} in publish
    assert [b["pattern"] for b in publish if "pattern" in b] == [HF_REPO_ID.pattern]
    # Text with a NUL is refused in every request body: free strings say so, keys too.
    job = component(document, "JobCreate")["properties"]
    assert job["verifier"]["pattern"] == job["dataset"]["pattern"] == NUL_FREE
    assert job["metadata"]["propertyNames"] == {"minLength": 1, "maxLength": 64,
                                                "pattern": NUL_FREE}
    assert component(document, "SecretPut")["properties"]["value"]["pattern"] == NUL_FREE


def test_switches_are_declared_as_they_are_accepted(document) -> None:
    job = component(document, "JobCreate")["properties"]
    assert job["evaluate"]["anyOf"] == [{"$ref": "#/components/schemas/EvaluateSpec"},
                                        {"type": "boolean"}]
    assert job["gate"]["anyOf"] == [{"$ref": "#/components/schemas/GateSpec"},
                                    {"const": False}, {"type": "null"}]


def test_the_deployment_one_source_rule_is_in_the_schema(document) -> None:
    sources = component(document, "DeploymentCreate")["oneOf"]
    assert [sorted(s["required"]) for s in sources] == [["checkpoint_id"], ["drafter", "verifier"]]
    checkpoint, drafter = (s["properties"] for s in sources)
    assert checkpoint["drafter"] == checkpoint["verifier"] == {"type": "null"}
    assert drafter["checkpoint_id"] == {"type": "null"}


def test_optional_parameters_are_never_null(document) -> None:
    """A query parameter or header is left out, never sent as null."""
    parameters = [p for operations in document["paths"].values()
                  for operation in operations.values() for p in operation.get("parameters", ())]
    assert parameters
    assert not [p for p in parameters if "null" in str(p["schema"])]
    stream = document["paths"]["/api/jobs/{job_id}/events/stream"]["get"]
    header = next(p for p in stream["parameters"] if p["in"] == "header")
    assert header["schema"]["type"] == "integer" and not header["required"]


def test_every_reference_resolves(document) -> None:
    """The chat completion body is written in by hand: its nested models are inlined."""
    refs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                refs.append(node["$ref"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(document)
    prefix = "#/components/schemas/"
    assert refs and all(r.startswith(prefix) and r[len(prefix):] in
                        document["components"]["schemas"] for r in refs)
    body = document["paths"]["/v1/chat/completions"]["post"]["requestBody"]
    options = body["content"]["application/json"]["schema"]["properties"]["stream_options"]
    assert options["anyOf"][0]["properties"]["include_usage"]


def test_every_route_but_the_probes_declares_the_bearer_key(document) -> None:
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    open_routes = {(path, method) for path, operations in document["paths"].items()
                   for method, operation in operations.items() if "security" not in operation}
    assert open_routes == {("/healthz", "get"), ("/readyz", "get")}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if (path, method) not in open_routes:
                assert "401" in operation["responses"], (path, method)


def test_the_dashboard_and_the_docs_files_are_not_in_the_document(document) -> None:
    """The static routes (app/dashboard.py, Swagger UI's and ReDoc's files) are left out, and
    every documented path is one the dashboard's fallback leaves alone."""
    paths = set(document["paths"])
    assert "/healthz" in paths and "/v1/chat/completions" in paths
    assert not [path for path in paths if not is_api_path(path) or path.startswith("/docs")]
    assert all(path.startswith(("/api/", "/v1/")) or path in ("/healthz", "/readyz")
               for path in paths)


def test_a_new_key_links_to_its_revocation_and_its_plaintext_is_declared_once(document) -> None:
    created = responses(document, "post", "/api/keys")["201"]
    assert list(created["links"].values()) == [{
        "operationRef": "#/paths/~1api~1keys~1{key_id}/delete",
        "parameters": {"key_id": "$response.body#/id"}}]
    assert "key" in component(document, "KeyCreated")["required"]
    assert "key" not in component(document, "KeyOut")["properties"]
    revoke = document["paths"]["/api/keys/{key_id}"]["delete"]
    assert "SPECDECK_GATEWAY_AUTH_CACHE_SECONDS" in revoke["description"]


def test_a_dry_run_plan_has_no_job_id(document) -> None:
    plan = responses(document, "post", "/api/jobs/plan")["200"]
    assert error_schema(plan) == error_schema(responses(document, "get", "/api/jobs/{job_id}/plan")
                                              ["200"]) == {"$ref": "#/components/schemas/PlanOut"}
    assert {"type": "null"} in component(document, "PlanOut")["properties"]["job_id"]["anyOf"]


def test_the_key_role_schema_names_the_roles_the_api_checks() -> None:
    from typing import get_args

    from app.roles import ROLES
    from app.schemas.keys import Role

    assert get_args(Role) == ROLES
