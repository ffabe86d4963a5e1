"""Stopping what a dead worker left (``reap`` in workers/supervisor.py), on real process groups:
a job's groups are stopped together, and every process found is reported, including one that
ends because another group was stopped (a launcher whose preloader is gone)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support.waiting import wait_for
from workers.supervisor import JOB_ENV, Group, belongs_to, reap

# Stands in for a preloader: holds a pipe's write end until it is stopped.
HOLDER = "import time; time.sleep(600)"
# Stands in for its launcher: exits as soon as the holder is gone (the pipe's end-of-file).
WAITER = "import sys; sys.stdin.buffer.read()"


@pytest.fixture
def groups() -> Iterator[tuple[subprocess.Popen, subprocess.Popen]]:
    read, write = os.pipe()
    env = {**os.environ, JOB_ENV: "job_reaped"}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], env=env, stdout=write,
                              start_new_session=True)
    waiter = subprocess.Popen([sys.executable, "-c", WAITER], env=env, stdin=read,
                              start_new_session=True)
    os.close(read)
    os.close(write)
    # Popen returns once a child's exec has begun, but the kernel sets up the new program's
    # environment (what /proc/<pid>/environ reads, and reap checks) a moment later: on a loaded
    # machine reap could read it empty (the waiter once went unreported in a clean-clone run).
    for proc in (holder, waiter):
        assert wait_for(lambda: belongs_to(proc.pid, "job_reaped"), 10,  # noqa: B023
                        "the child's environment to be set up")
    yield holder, waiter
    for proc in (holder, waiter):
        proc.kill()
        proc.wait()


def test_a_jobs_groups_are_stopped_together_and_every_process_is_reported(groups) -> None:
    holder, waiter = groups
    recorded = [Group.of(holder.pid), Group.of(waiter.pid)]  # the preloader's group first
    assert sorted(reap(recorded, "job_reaped", grace=10)) == sorted([holder.pid, waiter.pid])
    assert wait_for(lambda: holder.poll() is not None and waiter.poll() is not None, 10,
                    "both groups to be gone")


def test_groups_of_another_job_or_recorded_before_a_reboot_are_left_alone(groups) -> None:
    holder, waiter = groups
    assert reap([Group.of(holder.pid)], "job_other") == []
    before_a_reboot = Group(holder.pid, Group.of(holder.pid).started, "another-boot")
    assert reap([before_a_reboot], "job_reaped") == []
    assert holder.poll() is None and waiter.poll() is None
