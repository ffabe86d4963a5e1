"""Where the client's URL and key come from (flags > environment > profile), and the profile
file, readable by its owner only (app/client/config.py)."""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path

import pytest

from app.client import exits
from app.client.config import DEFAULT_URL, config_path, resolve, write_private, write_profile
from app.client.exits import CLIError


def flags(url: str | None = None, key: str | None = None, profile: str | None = None,
          retries: int | None = None) -> argparse.Namespace:
    return argparse.Namespace(url=url, api_key=key, profile=profile, retries=retries)


def test_flags_beat_environment_beat_profile(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    write_profile(config_path(env), "default", "http://profile:1", "sdk-profile")
    write_profile(config_path(env), "ci", "http://ci:1", "sdk-ci")

    got = resolve(flags(), env)
    assert (got.url, got.api_key, got.profile) == ("http://profile:1", "sdk-profile", "default")
    env_set = {**env, "SPECDECK_URL": "http://env:1", "SPECDECK_API_KEY": "sdk-env"}
    assert (resolve(flags(), env_set).url, resolve(flags(), env_set).api_key) == \
        ("http://env:1", "sdk-env")
    got = resolve(flags(url="http://flag:1", key="sdk-flag"), env_set)
    assert (got.url, got.api_key) == ("http://flag:1", "sdk-flag")
    # Each setting on its own: a flag URL with the environment's key.
    assert resolve(flags(url="http://flag:1"), env_set).api_key == "sdk-env"
    # Picking a profile, by flag or environment.
    assert resolve(flags(profile="ci"), env).api_key == "sdk-ci"
    assert resolve(flags(), {**env, "SPECDECK_PROFILE": "ci"}).url == "http://ci:1"
    with pytest.raises(CLIError) as raised:
        resolve(flags(profile="nope"), env)
    assert raised.value.code == exits.USAGE and "specdeck login --profile nope" in raised.value.message
    # Nothing anywhere: the default URL, no key.
    empty = resolve(flags(), {"XDG_CONFIG_HOME": str(tmp_path / "none")})
    assert (empty.url, empty.api_key) == (DEFAULT_URL, None)


def test_retry_settings(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path), "SPECDECK_RETRIES": "1",
           "SPECDECK_RETRY_BACKOFF": "0.2"}
    assert (resolve(flags(), env).retries, resolve(flags(), env).backoff) == (1, 0.2)
    assert resolve(flags(retries=7), env).retries == 7
    with pytest.raises(CLIError) as raised:
        resolve(flags(), {**env, "SPECDECK_RETRIES": "many"})
    assert raised.value.code == exits.USAGE


def test_profile_file_is_0600_from_the_start(tmp_path: Path) -> None:
    path = config_path({"HOME": str(tmp_path)})
    assert path == tmp_path / ".config" / "specdeck" / "config.json"
    old = os.umask(0o000)  # a permissive umask must not widen it
    try:
        write_profile(path, "default", "http://a:1", "sdk-1")
        write_profile(path, "other", "http://b:1", "sdk-2")  # rewritten, still 0600
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert resolve(flags(), {"HOME": str(tmp_path)}).api_key == "sdk-1"
    assert list(path.parent.iterdir()) == [path]  # no temporary file left


def test_write_private_replaces_a_wider_file(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text("old")
    path.chmod(0o644)
    write_private(path, "new\n")
    assert path.read_text() == "new\n" and stat.S_IMODE(path.stat().st_mode) == 0o600
