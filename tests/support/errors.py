"""The one error shape every 4xx and 5xx answers in: ``{"error": {"message", "type", "param",
"code"}}`` (an upload's line-numbered problems add ``errors``)."""

from __future__ import annotations

from typing import Any

FIELDS = {"message", "type", "param", "code"}


def assert_error(response: Any, status: int, code: str | None, param: str | None = None,
                 *, errors: bool = False) -> dict[str, Any]:
    """The response is ``status`` in the error shape, with this ``code`` (and ``param``, when
    given); ``errors``: the error may list problems too. Returns the error object."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    allowed = FIELDS | {"errors"} if errors else FIELDS
    assert FIELDS <= set(body["error"]) <= allowed, body
    assert body["error"]["code"] == code and body["error"]["message"]
    assert body["error"]["code"] is None or isinstance(body["error"]["code"], str)
    if param is not None:
        assert body["error"]["param"] == param
    return body["error"]
