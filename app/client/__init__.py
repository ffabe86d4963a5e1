"""The ``specdeck`` client commands: the REST API over HTTP (httpx), for people and CI.

Kept apart from the server commands in app/cli.py and free of the server stack (no SQLAlchemy,
FastAPI app or torch import), so that a client command starts fast on a machine that has only
the CLI installed.
"""
