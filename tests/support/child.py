"""A real long-running child process for supervision tests: it counts, prints and handles
SIGTERM like the trainer does (saves a marker, then exits). It runs for ``--seconds``, or until
the test creates the ``--until`` file: a test that needs a job to hold its slot while it looks
says when it is done looking, instead of guessing how long that takes."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--pid-file", type=Path)
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--exit-code", type=int, default=0, help="exit with this code when done")
    parser.add_argument("--until", type=Path,
                        help="done as soon as this file exists (--seconds is then the cap)")
    args = parser.parse_args()
    if args.pid_file:
        # Whole or not at all: a test polls for this file and reads it at once.
        partial = args.pid_file.with_suffix(".partial")
        partial.write_text(f"{os.getpid()} {os.getpgid(0)}")
        partial.rename(args.pid_file)
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: (print("got SIGTERM, exiting", flush=True), sys.exit(143)))
    deadline = time.monotonic() + args.seconds
    step = 0
    while time.monotonic() < deadline and not (args.until and args.until.exists()):
        step += 1
        print(f"step {step}", flush=True)
        time.sleep(0.2)
    print("done", flush=True)
    sys.exit(args.exit_code)


if __name__ == "__main__":
    main()
