"""A private PostgreSQL cluster (``initdb`` + ``pg_ctl``) on its own port, for tests that stop
and start the database: the shared one on 5432 is never touched."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import sqlalchemy as sa

from tests.support.processes import without_test_marker

# PostgreSQL refuses to run as root: run its tools as the ``postgres`` user then.
_AS_POSTGRES = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PrivateCluster:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="specdeck-pg-"))
        self.data = self.dir / "data"
        self.port = _free_port()
        if _AS_POSTGRES:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "--no-sync", "-E", "UTF8")
        self.start()
        admin = sa.create_engine(self.url("postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text("CREATE DATABASE specdeck"))
        admin.dispose()

    def url(self, database: str = "specdeck") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *argv: str) -> None:
        subprocess.run([*_AS_POSTGRES, *argv], check=True, capture_output=True, cwd=self.dir)

    def start(self) -> None:
        """The server belongs to the cluster's owner (a module's fixture), not to the test that
        restarts it."""
        with without_test_marker():
            self._run("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "server.log"), "-w",
                      "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
                      "-c fsync=off", "start")

    def stop(self) -> None:
        """``pg_ctl stop -m fast``: every connection is cut, as in a real outage."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def destroy(self) -> None:
        try:
            self.stop()
        except subprocess.CalledProcessError:
            pass  # already stopped
        shutil.rmtree(self.dir, ignore_errors=True)
