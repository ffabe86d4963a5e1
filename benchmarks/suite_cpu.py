"""Where a test run's CPU time goes: by what each process runs, and by test.

Usage::

    .venv/bin/python benchmarks/suite_cpu.py [PYTEST ARGS]   # e.g. tests/e2e -n 2 --dist loadgroup

Runs pytest with the given arguments and, until it exits, reads every process's CPU time from
``/proc`` once a second. Each process is put under what it runs (its command line) and under the
test that started it (the suite's per-test mark in its environment, tests/support/processes.py;
a small plugin loaded into pytest maps each mark to its test). It prints the CPU seconds per kind
of process, their share, and the tests that used the most, next to what the machine's cores
could have given over the run. Linux only. A process's last second before it exits is missed,
so the figures are a little low.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST_MARK = b"PYTEST_TEST_MARK="  # tests/support/processes.py's TEST_ENV
HZ = os.sysconf("SC_CLK_TCK")
# (kind, what its command line contains), the first that matches.
KINDS = [
    ("vLLM engine core", "EngineCore"), ("chromium", "chromium"), ("Postgres", "postgres"),
    ("Redis", "redis-server"), ("vLLM API server", "local.serve"), ("trainer", "local.train"),
    ("prepare-data", "speculators"), ("trainer", "torchrun"),
    # after its launchers (local.preload launch MODULE): the preloader and what it forked
    ("preloader and its servers", "local.preload"),
    ("specdeck run", "specdeck run"), ("SpecDeck API", "specdeck api"),
    ("SpecDeck worker", "specdeck worker"), ("pytest and its xdist workers", "pytest"),
    ("pytest and its xdist workers", "exec(eval(sys.stdin"), ("node (Playwright)", "node"),
]
# A vLLM server's start: its command (local.serve), or its launcher (local.preload launch
# workers.runtimes.local.serve) when a preloader forks it.
VLLM_STARTS = ("vLLM API server",)
TOP = int(os.environ.get("SUITE_CPU_TOP", "30"))  # the tests listed, most CPU first
PLUGIN = '''
import json, os
def pytest_runtest_call(item):
    with open(os.environ["SUITE_CPU_MARKS"], "a") as out:
        out.write(json.dumps([os.environ.get("PYTEST_TEST_MARK"), item.nodeid]) + "\\n")
'''


def kind_of(cmdline: str) -> str:
    if not cmdline:
        return "kernel threads"
    return next((kind for kind, text in KINDS if text in cmdline), "other")


def mark_of(pid: str) -> str | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((e[len(TEST_MARK):].decode() for e in environ if e.startswith(TEST_MARK)), None)


class Sampler:
    """CPU seconds per (kind, test mark), from every process seen."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, str], tuple[str, str | None]] = {}  # (pid, start) -> labels
        self.last: dict[tuple[str, str], float] = {}
        self.cpu: collections.Counter[tuple[str, str | None]] = collections.Counter()
        self.started: collections.Counter[tuple[str, str | None]] = collections.Counter()

    def sample(self) -> None:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                fields = stat[stat.rfind(")") + 2:].split()
                seconds = (int(fields[11]) + int(fields[12])) / HZ
                key = (pid, fields[19])  # a pid with its start time: never a reused one
                if key not in self.seen:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                    self.seen[key] = kind_of(cmdline.decode(errors="replace")), mark_of(pid)
                    self.started[self.seen[key]] += 1
            except (OSError, IndexError, ValueError):
                continue
            self.cpu[self.seen[key]] += seconds - self.last.get(key, 0.0)
            self.last[key] = seconds


def main(pytest_args: list[str]) -> int:
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "suite_cpu_marks.py").write_text(PLUGIN)
        marks = Path(folder) / "marks.jsonl"
        env = {**os.environ, "SUITE_CPU_MARKS": str(marks),
               "PYTHONPATH": os.pathsep.join(filter(None, [folder, os.environ.get("PYTHONPATH")]))}
        sampler = Sampler()
        sampler.sample()
        before = collections.Counter(sampler.cpu)  # what ran before pytest is not counted
        began = time.monotonic()
        pytest = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "suite_cpu_marks",
                                   *pytest_args], cwd=ROOT, env=env)
        while pytest.poll() is None:
            time.sleep(1)
            sampler.sample()
        wall = time.monotonic() - began
        tests = dict(json.loads(line) for line in marks.read_text().splitlines()) \
            if marks.exists() else {}
    cpu = sampler.cpu - before
    total = sum(cpu.values())
    cores = os.cpu_count() or 1
    print(f"pytest {' '.join(pytest_args)}: exit {pytest.returncode}, {wall:.0f} s; "
          f"{total:.0f} CPU seconds of the {wall * cores:.0f} that {cores} cores had "
          f"({total / (wall * cores):.0%})\n")
    by_kind: collections.Counter[str] = collections.Counter()
    by_test: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    processes: collections.Counter[str] = collections.Counter()
    vllm_starts: collections.Counter[str] = collections.Counter()
    for (kind, mark), seconds in cpu.items():
        by_kind[kind] += seconds
        if mark in tests:
            by_test[tests[mark]][kind] += seconds
    for (kind, mark), count in sampler.started.items():
        processes[kind] += count
        if mark in tests and kind in VLLM_STARTS:
            vllm_starts[tests[mark]] += count
    print("| process | CPU s | share | processes seen |\n|---|---|---|---|")
    for kind, seconds in by_kind.most_common():
        print(f"| {kind} | {seconds:.0f} | {seconds / total:.0%} | {processes[kind]} |")
    print("\n| test (processes it started) | CPU s | vLLM servers | most of it |\n|---|---|---|---|")
    for test, kinds in sorted(by_test.items(), key=lambda item: -sum(item[1].values()))[:TOP]:
        top = ", ".join(f"{kind} {seconds:.0f}" for kind, seconds in kinds.most_common(3))
        print(f"| `{test}` | {sum(kinds.values()):.0f} | {vllm_starts[test]} | {top} |")
    return pytest.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
