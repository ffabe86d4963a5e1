"""`specdeck run` (what `make run` calls) as a test starts and stops it: in a directory of its
own on the embedded default (no SPECDECK_ settings but the ones given), in a process group of
its own, its output in a log file there (nothing has to keep reading a pipe)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from app.supervise import die_with_parent
from tests.conftest import SPECDECK

LOG = "specdeck-run.log"


def seed_demo(cwd: Path, demo_assets: tuple[Path, Path]) -> Path:
    """The session's demo verifier and conversations where `specdeck run` looks for them (it
    would make the same ones, slowly). Returns the conversations' path."""
    model, data = demo_assets
    shutil.copytree(model, cwd / "var" / "models" / "demo")
    (cwd / "var" / "data").mkdir(parents=True)
    return Path(shutil.copy(data, cwd / "var" / "data" / "demo.jsonl"))


@dataclass
class SpecdeckRun:
    proc: subprocess.Popen
    cwd: Path
    port: int
    key: str
    dataset_id: str | None  # None with --no-demo

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return (self.cwd / LOG).read_text(errors="replace")

    def lines(self) -> list[str]:
        """The output up to and including its banner's last line."""
        text = self.output()
        return text[:text.index("Ctrl-C stops")].splitlines(keepends=True)

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"{self.url}/readyz never answered 200\n{self.output()}")

    def interrupt(self, timeout: float = 90) -> None:
        """Ctrl-C in a terminal: SIGINT to the whole foreground process group."""
        os.killpg(self.proc.pid, signal.SIGINT)
        self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        """The last resort: SIGKILL to the group, if it still runs."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def start(cwd: Path, port: int, env: dict[str, str] | None = None, args: tuple[str, ...] = (),
          timeout: float = 120) -> SpecdeckRun:
    """Start `specdeck run --port PORT [ARGS]` in ``cwd`` and wait for its banner (the key, and
    the demo dataset unless --no-demo). ``env``: SPECDECK_ settings on top of none."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SPECDECK_")}
    environ.update({"PYTHONUNBUFFERED": "1", **(env or {})})
    with (cwd / LOG).open("w") as log:
        proc = subprocess.Popen([SPECDECK, "run", "--port", str(port), *args], cwd=cwd, env=environ,
                                stdout=log, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, preexec_fn=die_with_parent)
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline and proc.poll() is None:
        text = (cwd / LOG).read_text(errors="replace")
        if "Ctrl-C stops" in text:
            break
        time.sleep(0.2)
    key = re.search(r"API key \(project 'default'\): (\S+)", text)
    dataset = re.search(r"demo dataset: (ds_\w+)", text)
    if not (key and (dataset or "--no-demo" in args) and "Ctrl-C stops" in text):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        raise AssertionError(f"`specdeck run` printed no key (or no demo dataset):\n{text}")
    return SpecdeckRun(proc=proc, cwd=cwd, port=port, key=key.group(1),
                       dataset_id=dataset.group(1) if dataset else None)


def processes_in(directory: Path) -> list[psutil.Process]:
    """Live processes whose working directory is ``directory`` or below it."""
    found = []
    root = directory.resolve()
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            cwd = Path(proc.cwd())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
        if cwd == root or root in cwd.parents:
            found.append(proc)
    return found
