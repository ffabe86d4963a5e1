"""Cursor paging of the lists (``Page``): newest first, ``after`` the last id of the page
before, and whether more follow."""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import Select
from sqlalchemy.orm import Session

Row = TypeVar("Row")


def newest_first(session: Session, query: Select[tuple[Row]], id_column: Any, *, limit: int,
                 after: str | None) -> tuple[list[Row], bool]:
    """A page of ``query``'s rows, ids descending, starting after ``after``."""
    if after is not None:
        query = query.where(id_column < after)
    rows = list(session.scalars(query.order_by(id_column.desc()).limit(limit + 1)))
    return rows[:limit], len(rows) > limit
