from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.settings import DEFAULT_SECRET_KEY, Settings


def test_development_accepts_the_defaults() -> None:
    settings = Settings(_env_file=None)
    assert settings.database_url.startswith("sqlite:///")
    assert settings.broker_url.startswith("sqla+sqlite:///")


@pytest.mark.parametrize("secret", [DEFAULT_SECRET_KEY, "short"])
def test_production_refuses_default_or_weak_secrets(secret: str) -> None:
    with pytest.raises(ValidationError, match="SPECDECK_SECRET_KEY"):
        Settings(_env_file=None, env="production", secret_key=secret,
                 database_url="postgresql+psycopg://x@db/specdeck")


def test_production_refuses_sqlite() -> None:
    with pytest.raises(ValidationError, match="Postgres"):
        Settings(_env_file=None, env="production", secret_key="x" * 40)


def test_environment_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDECK_BROKER_URL", "redis://127.0.0.1:6379/3")
    assert Settings(_env_file=None).broker_url == "redis://127.0.0.1:6379/3"
