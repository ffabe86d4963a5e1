"""What the client commands print: the API's objects as JSON (``--json``) or as text for people
on stdout; notes, progress and errors on stderr."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any


def note(message: str) -> None:
    """A line for the person or the CI log, never for a script reading stdout."""
    print(message, file=sys.stderr, flush=True)


def emit_json(value: Any) -> None:
    print(json.dumps(value, indent=2), flush=True)


def show(value: Any, as_json: bool, text: str | None = None) -> None:
    """One object: as JSON with --json (or when it has no text form), else ``text``."""
    if as_json or text is None:
        emit_json(value)
    else:
        print(text, flush=True)


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, str) and len(value) >= 19 and value[10:11] == "T":
        return value[:19].replace("T", " ")  # an ISO timestamp, to the second
    return str(value)


def table(rows: Iterable[dict[str, Any]], columns: Sequence[str]) -> str:
    """Rows as aligned columns under a header."""
    cells = [list(columns)] + [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip()
                     for line in cells)


def listing(page: dict[str, Any], as_json: bool, columns: Sequence[str]) -> None:
    """A page of a list: the page as the API sent it with --json, else a table (and how to get
    the next page)."""
    if as_json:
        emit_json(page)
        return
    print(table(page["data"], columns), flush=True)
    if page.get("has_more"):
        note(f"more: --after {page['last_id']}")
