from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.settings import DEFAULT_SECRET_KEY, Settings, warn_if_default_secret_key


@pytest.fixture(autouse=True)
def _no_specdeck_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The defaults, whatever an earlier test in this process configured (conftest.configure)."""
    import os

    for name in [n for n in os.environ if n.startswith("SPECDECK_")]:
        monkeypatch.delenv(name)


def test_development_accepts_the_defaults() -> None:
    settings = Settings(_env_file=None)
    assert settings.database_url.startswith("sqlite:///")
    assert settings.broker_url.startswith("sqla+sqlite:///")


@pytest.mark.parametrize("secret", [DEFAULT_SECRET_KEY, "short"])
def test_production_refuses_default_or_weak_secrets(secret: str) -> None:
    with pytest.raises(ValidationError, match="SPECDECK_SECRET_KEY"):
        Settings(_env_file=None, env="production", secret_key=secret,
                 database_url="postgresql+psycopg://x@db/specdeck")


def test_the_default_secret_key_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="specdeck"):
        assert warn_if_default_secret_key(Settings(_env_file=None, secret_key=DEFAULT_SECRET_KEY))
    assert "SPECDECK_SECRET_KEY is not set" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="specdeck"):
        assert not warn_if_default_secret_key(Settings(_env_file=None, secret_key="x" * 40))
    assert caplog.text == ""


def test_production_refuses_sqlite() -> None:
    with pytest.raises(ValidationError, match="Postgres"):
        Settings(_env_file=None, env="production", secret_key="x" * 40)


def test_environment_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDECK_BROKER_URL", "redis://127.0.0.1:6379/3")
    assert Settings(_env_file=None).broker_url == "redis://127.0.0.1:6379/3"


def test_readme_lists_every_setting() -> None:
    """README's Configuration section names each field of Settings (as SPECDECK_<NAME>)."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    missing = [name for name in Settings.model_fields if f"`{name.upper()}`" not in section]
    assert not missing, f"README's Configuration section misses {missing}"


def test_gateway_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDECK_GATEWAY_RATE_LIMIT_RPM", "0")
    monkeypatch.setenv("SPECDECK_GATEWAY_UPSTREAM_TIMEOUT_SECONDS", "3")
    settings = Settings(_env_file=None)
    assert settings.gateway_rate_limit_rpm == 0 and settings.gateway_upstream_timeout_seconds == 3
    monkeypatch.setenv("SPECDECK_GATEWAY_MAX_TOKENS", "0")
    with pytest.raises(ValidationError, match="gateway_max_tokens"):
        Settings(_env_file=None)


def test_quota_settings_have_defaults_and_refuse_negatives(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(_env_file=None)
    assert (settings.quota_active_jobs, settings.quota_active_deployments,
            settings.quota_dataset_bytes) == (20, 8, 10 * 1024**3)
    monkeypatch.setenv("SPECDECK_QUOTA_ACTIVE_JOBS", "0")  # no limit
    assert Settings(_env_file=None).quota_active_jobs == 0
    monkeypatch.setenv("SPECDECK_QUOTA_DATASET_BYTES", "-1")
    with pytest.raises(ValidationError, match="quota_dataset_bytes"):
        Settings(_env_file=None)
