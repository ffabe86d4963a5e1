"""OpenAPI links: from a response that carries a resource to the operations on it, so that a
client (and Schemathesis' stateful phase) can follow the id it was given."""

from __future__ import annotations

from typing import Any


def links(param: str, *operations: tuple[str, str], field: str = "id") -> dict[str, Any]:
    """A response's ``links``: each (method, path) gets ``param`` from the body's ``field``."""
    return {"links": {
        f"{method}{path}".replace("/", "_").replace("{", "").replace("}", ""): {
            "operationRef": "#/paths/" + path.replace("~", "~0").replace("/", "~1") + f"/{method}",
            "parameters": {param: f"$response.body#/{field}"},
        } for method, path in operations}}
