"""Validation of user-supplied paths: they must stay under a configured root."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from app.errors import APIError

NAME_MAX = 255  # bytes in one path component: the OS answers ENAMETOOLONG past it


def looks_like_path(value: str) -> bool:
    return value.startswith(("/", ".", "~")) or "\\" in value or ".." in PurePosixPath(value).parts


def exists(path: Path) -> bool:
    """Whether ``path`` exists; a path the OS cannot even look up (a component over NAME_MAX)
    does not."""
    try:
        return path.exists()
    except OSError:
        return False


def resolve_under(root: Path, value: str, *, param: str, what: str) -> Path:
    """Resolve ``value`` (relative to ``root``, or absolute) and refuse anything outside ``root``.

    ``..`` components are refused outright; symlinks are followed, so a link that leads out of
    the root is refused too.
    """
    if "\x00" in value or ".." in PurePosixPath(value).parts or value.startswith("~"):
        raise APIError(422, f"{param} must not contain '..' or '~'", code="invalid_path",
                       param=param)
    if any(len(part.encode()) > NAME_MAX for part in PurePosixPath(value).parts):
        raise APIError(422, f"{param} has a path component longer than {NAME_MAX} bytes",
                       code="invalid_path", param=param)
    root_real = root.resolve()
    candidate = Path(value) if Path(value).is_absolute() else root_real / value
    real = candidate.resolve()
    if not real.is_relative_to(root_real):
        raise APIError(422, f"{param} must be a path under the {what} root", code="path_outside_root",
                       param=param)
    return real
