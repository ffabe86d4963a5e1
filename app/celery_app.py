"""Celery configuration for hours-long GPU tasks. The message only says "look at job X"."""

from __future__ import annotations

from functools import lru_cache

from celery import Celery

from app.settings import Settings, get_settings


def create_celery(settings: Settings) -> Celery:
    app = Celery("specdeck", broker=settings.broker_url, include=["workers.tasks"])
    transport_options: dict[str, object] = {}
    if settings.broker_url.startswith("redis"):
        # A long job's message stays unacknowledged for hours; Redis would redeliver it after
        # visibility_timeout. That is harmless (the lease decides who runs a job), just wasteful.
        transport_options["visibility_timeout"] = 24 * 3600
    elif settings.broker_url.startswith("sqla+"):
        # kombu hands every transport option of this transport to create_engine(), so the poll
        # interval (default 1 s) can only be set on the transport class.
        from kombu.transport import sqlalchemy as sqla_transport

        sqla_transport.Transport.polling_interval = 0.1
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_default_queue=settings.queue,
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        task_send_sent_event=False,
    )
    return app


@lru_cache
def get_celery() -> Celery:
    return create_celery(get_settings())


celery_app = get_celery()
