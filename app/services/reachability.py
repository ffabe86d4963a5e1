"""Can this process reach the database and the broker: asked the same way by readiness
(``/readyz``) and by `specdeck doctor` on a worker host."""

from __future__ import annotations

from sqlalchemy import text

from app.db import get_engine


def ping_database() -> None:
    """A real round trip on the configured database (SPECDECK_DATABASE_URL); raises if not."""
    with get_engine().connect() as conn:
        conn.execute(text("SELECT 1"))


def ping_broker() -> None:
    """A connection to the configured broker (SPECDECK_BROKER_URL), through Celery's own
    transport; raises if there is none. Redis is really connected to; kombu's SQLAlchemy
    transport (the embedded default) connects lazily, so for it this checks little more than
    the URL."""
    from app.celery_app import get_celery

    with get_celery().connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=2)
