"""The Alembic migrations build exactly the schema the models describe, on both backends, and
downgrade cleanly."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

from app.db.models import Base
from tests.conftest import Stack


def test_migrations_match_the_models(stack: Stack) -> None:
    engine = create_engine(stack.env["SPECDECK_DATABASE_URL"])
    try:
        with engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    finally:
        engine.dispose()


def test_downgrade_to_base_and_up_again(stack: Stack) -> None:
    from alembic import command
    from alembic.config import Config

    from app.cli import ROOT

    config = Config(str(ROOT / "alembic.ini"))
    config.attributes.update(configure_logger=False, database_url=stack.env["SPECDECK_DATABASE_URL"])
    command.downgrade(config, "base")
    command.upgrade(config, "head")
    test_migrations_match_the_models(stack)
