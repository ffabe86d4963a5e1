"""Database engine, sessions and the after-commit hook queue."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker

from app.settings import get_settings

log = logging.getLogger(__name__)
T = TypeVar("T")

# What the database raises while it is down or restarting, or when every pooled connection is
# taken: the same work may succeed in a moment.
UNAVAILABLE = (OperationalError, InterfaceError, PoolTimeout)


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record) -> None:  # noqa: ANN001
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        event.listen(engine, "before_cursor_execute", _sqlite_lock_for_update)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def _sqlite_lock_for_update(_conn, cursor, _sql, _params, context, _many) -> None:  # noqa: ANN001
    """On SQLite, a SELECT that asked for FOR UPDATE (or FOR SHARE) first takes the write lock.

    SQLite has no row locks, so SQLAlchemy leaves FOR UPDATE out of its SQL; and pysqlite opens a
    transaction only before an INSERT, UPDATE or DELETE, so the SELECT would run on its own, and
    two requests of a project could both read, both pass a check (a quota, its last active key)
    and both write. ``BEGIN IMMEDIATE`` opens the transaction with the database's write lock,
    held until SQLAlchemy's COMMIT or ROLLBACK ends it (pysqlite follows the connection's state);
    another one waits for it (busy_timeout), then reads what it wrote. That is more than a row
    lock (one writer at a time, as on SQLite anyway) and never less.

    A transaction already open began with a write, which took the write lock already. The one
    exception: a SAVEPOINT (``begin_nested``) opened on a fresh connection, with the locking
    SELECT before its first write: nothing upgrades that read to a lock. No caller does that.
    """
    compiled = context.compiled
    if compiled is not None and getattr(compiled.statement, "_for_update_arg", None) is not None \
            and not cursor.connection.in_transaction:
        cursor.execute("BEGIN IMMEDIATE")


@lru_cache
def get_engine() -> Engine:
    return make_engine(get_settings().database_url)


@contextmanager
def read_scope() -> Iterator[Connection]:
    """A connection for one query that needs no transaction around it (a single SELECT sees
    one committed state by itself). On Postgres, in autocommit: no BEGIN and no COMMIT, two of
    a session's four round trips (the pool's pre-ping, BEGIN, the query, COMMIT); the gateway's
    cache loads, which run in the background while a key or project has traffic, take 20-30%
    less time and 10-25% less CPU so. pysqlite opens no transaction for a SELECT anyway, and
    switching a SQLite connection to autocommit and back costs more than it saves
    (docs/benchmarks.md, "Why the gateway is built as it is")."""
    with get_engine().connect() as connection:
        if connection.dialect.name != "sqlite":
            connection.execution_options(isolation_level="AUTOCOMMIT")  # reset when pooled
        yield connection


@lru_cache
def get_sessionmaker() -> sessionmaker[Session]:
    return sessionmaker(get_engine(), expire_on_commit=False)


def after_commit(session: Session, callback: Callable[[], None]) -> None:
    """Run ``callback`` once the session's transaction has committed; drop it on rollback.

    This is how Celery kicks are sent: never for a row that did not make it to the database.
    """
    session.info.setdefault("after_commit", []).append(callback)


@event.listens_for(Session, "after_commit")
def _run_after_commit(session: Session) -> None:
    callbacks = session.info.pop("after_commit", [])
    for callback in callbacks:
        callback()


@event.listens_for(Session, "after_rollback")
def _drop_after_commit(session: Session) -> None:
    session.info.pop("after_commit", None)


@contextmanager
def session_scope() -> Iterator[Session]:
    """A unit of work for code outside a request (workers, CLI): commit on success."""
    session = get_sessionmaker()()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def with_retries(fn: Callable[[], T], *, seconds: float, what: str) -> T:
    """``fn()``, run again with backoff while the database is unavailable, for up to
    ``seconds``; then its error is raised. ``fn`` must be one whole unit of work (its own
    ``session_scope``), so that a retry repeats all of it or nothing."""
    deadline = time.monotonic() + seconds
    delay = 0.25
    while True:
        try:
            return fn()
        except UNAVAILABLE as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.warning("%s: the database is unavailable (%s); retrying in %.2g s", what,
                        str(exc).splitlines()[0], delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
