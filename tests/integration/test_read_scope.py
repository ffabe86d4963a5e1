"""``app.db.read_scope``, the gateway's cache loads' connection, on both databases: on Postgres
each statement is its own transaction (no BEGIN, no COMMIT around the query), and the pooled
connection it used is transactional again for the next ``session_scope``."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import func, select, text

from tests.conftest import configure


@pytest.fixture(params=["postgres", "sqlite"])
def database(request: pytest.FixtureRequest) -> Iterator[str]:
    url = request.getfixturevalue("pg_url" if request.param == "postgres" else "sqlite_url")
    before = os.environ.get("SPECDECK_DATABASE_URL")
    configure({"SPECDECK_DATABASE_URL": url})
    try:
        yield request.param
    finally:
        from app.db import get_engine

        get_engine().dispose()
        if before is None:
            os.environ.pop("SPECDECK_DATABASE_URL", None)
        configure({} if before is None else {"SPECDECK_DATABASE_URL": before})


def test_a_read_sees_what_was_committed(database: str) -> None:
    from app.db import read_scope, session_scope
    from app.db.models import Project

    name = f"read-{uuid.uuid4().hex[:8]}"
    with session_scope() as session:
        session.add(Project(name=name))
    with read_scope() as connection:
        assert connection.execute(select(Project.name).where(Project.name == name)).scalar() \
            == name


def test_on_postgres_each_statement_is_its_own_transaction(database: str) -> None:
    if database != "postgres":
        pytest.skip("SQLite: pysqlite opens no transaction for a SELECT; nothing is switched")
    from app.db import read_scope, session_scope

    with read_scope() as connection:
        first = connection.execute(text("SELECT now()")).scalar()
        time.sleep(0.01)
        second = connection.execute(text("SELECT now()")).scalar()
    assert second > first  # now() is the transaction's start: a new one for each statement
    with session_scope() as session:  # the same two statements in a session share one
        first = session.execute(text("SELECT now()")).scalar()
        time.sleep(0.01)
        assert session.execute(text("SELECT now()")).scalar() == first


def test_the_pooled_connection_is_transactional_again(database: str) -> None:
    from app.db import read_scope, session_scope
    from app.db.models import Project

    with read_scope() as connection:
        connection.execute(select(1))
        used = connection.connection.dbapi_connection
    name = f"rolled-back-{uuid.uuid4().hex[:8]}"
    with pytest.raises(RuntimeError), session_scope() as session:
        assert session.connection().connection.dbapi_connection is used  # the same one, pooled
        session.add(Project(name=name))
        session.flush()  # the INSERT has gone to the database
        raise RuntimeError("rolled back")
    with session_scope() as session:
        assert session.scalar(select(func.count()).where(Project.name == name)) == 0
