"""A real long-running child process for supervision tests: it counts, prints and handles
SIGTERM like the trainer does (saves a marker, then exits)."""

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
    args = parser.parse_args()
    if args.pid_file:
        args.pid_file.write_text(f"{os.getpid()} {os.getpgid(0)}")
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: (print("got SIGTERM, exiting", flush=True), sys.exit(143)))
    deadline = time.monotonic() + args.seconds
    step = 0
    while time.monotonic() < deadline:
        step += 1
        print(f"step {step}", flush=True)
        time.sleep(0.2)
    print("done", flush=True)
    sys.exit(args.exit_code)


if __name__ == "__main__":
    main()
