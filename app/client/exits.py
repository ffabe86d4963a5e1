"""The client's exit codes (documented in docs/cli.md and docs/ci.md) and the one exception that
ends a command with one of them."""

from __future__ import annotations

SUCCEEDED = 0  # the command did what it was asked; a waited-for job succeeded
JOB_FAILED = 1  # the job (or deployment) that was waited for failed
USAGE = 2  # a usage error, or the API refused the request (4xx)
CANCELLED = 3  # the job that was waited for was cancelled
TIMED_OUT = 4  # --timeout passed first; the job or deployment keeps going
UNREACHABLE = 5  # the server could not be reached, or kept failing (5xx), after the retries


class CLIError(Exception):
    """End the command: ``message`` on stderr, then exit with ``code``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def exit_code_for_status(status: int) -> int:
    """The exit code of an HTTP error answer that retrying did not (or could not) fix."""
    return USAGE if 400 <= status < 500 else UNREACHABLE
