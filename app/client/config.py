"""Where the client's URL and key come from: flags, then the environment (``SPECDECK_URL``,
``SPECDECK_API_KEY``), then a profile that ``specdeck login`` wrote.

Profiles live in ``$XDG_CONFIG_HOME/specdeck/config.json`` (default ``~/.config``), a file only
its owner can read (created with mode 0600, never widened):
``{"profiles": {"default": {"url": "...", "api_key": "..."}}}``. ``--profile`` or
``SPECDECK_PROFILE`` picks one; "default" otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.client import exits
from app.client.exits import CLIError

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_PROFILE = "default"
DEFAULT_RETRIES = 5
DEFAULT_BACKOFF = 0.5  # seconds before the first retry; doubled for each next one


@dataclass(frozen=True)
class Config:
    url: str
    api_key: str | None
    profile: str
    retries: int
    backoff: float


def config_path(environ: Mapping[str, str] = os.environ) -> Path:
    base = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME", "~")).expanduser()
                                                  / ".config")
    return Path(base) / "specdeck" / "config.json"


def read_profiles(path: Path) -> dict[str, dict[str, Any]]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise CLIError(exits.USAGE, f"cannot read the profiles in {path}: {exc}") from exc
    profiles = document.get("profiles") if isinstance(document, dict) else None
    return profiles if isinstance(profiles, dict) else {}


def write_private(path: Path, text: str) -> None:
    """Write ``path`` whole, readable by its owner only: a new file created with mode 0600 (a
    key in it is never readable by others, not even for a moment), then moved into place."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.unlink(missing_ok=True)  # left by a crash: O_EXCL makes the file anew, 0600
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_profile(path: Path, name: str, url: str, api_key: str) -> None:
    """Add or replace one profile."""
    profiles = read_profiles(path)
    profiles[name] = {"url": url, "api_key": api_key}
    write_private(path, json.dumps({"profiles": profiles}, indent=2) + "\n")


def _number(value: str, name: str, kind: type) -> Any:
    try:
        number = kind(value)
    except ValueError:
        raise CLIError(exits.USAGE, f"{name} must be a number, not {value!r}") from None
    if number < 0:
        raise CLIError(exits.USAGE, f"{name} must not be negative")
    return number


def resolve(args: argparse.Namespace, environ: Mapping[str, str] = os.environ, *,
            existing_profile: bool = True) -> Config:
    """The command's URL, key and retry settings: flags > environment > profile > defaults.
    ``existing_profile``: a profile named with --profile must exist (not so for login, which
    writes it)."""
    profile = args.profile or environ.get("SPECDECK_PROFILE") or DEFAULT_PROFILE
    stored = read_profiles(config_path(environ)).get(profile, {})
    if existing_profile and args.profile and not stored:
        raise CLIError(exits.USAGE, f"no profile '{profile}' in {config_path(environ)}: "
                       f"run `specdeck login --profile {profile}`")
    url = args.url or environ.get("SPECDECK_URL") or stored.get("url") or DEFAULT_URL
    key = args.api_key or environ.get("SPECDECK_API_KEY") or stored.get("api_key")
    retries = (args.retries if args.retries is not None
               else _number(environ.get("SPECDECK_RETRIES", str(DEFAULT_RETRIES)),
                            "SPECDECK_RETRIES", int))
    backoff = _number(environ.get("SPECDECK_RETRY_BACKOFF", str(DEFAULT_BACKOFF)),
                      "SPECDECK_RETRY_BACKOFF", float)
    return Config(url=url, api_key=key, profile=profile, retries=retries, backoff=backoff)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every client command takes."""
    group = parser.add_argument_group("connection")
    group.add_argument("--url", help=f"the API's base URL (env SPECDECK_URL; default {DEFAULT_URL})")
    group.add_argument("--api-key", help="an API key (env SPECDECK_API_KEY; prefer the "
                       "environment or `specdeck login`: arguments are visible to other users)")
    group.add_argument("--profile", help="a profile written by `specdeck login` (env "
                       "SPECDECK_PROFILE; default 'default')")
    group.add_argument("--retries", type=int, metavar="N", help="retries of a request after a "
                       f"network error or 502/503/504 (env SPECDECK_RETRIES; default {DEFAULT_RETRIES})")
    parser.add_argument("--json", action="store_true",
                        help="print the API's objects as JSON on stdout, and nothing else there")
