"""A double of vLLM's API server for the preloader's tests (workers/runtimes/local/preload.py):
forked by the preloader as vLLM's would be, it prints what it was given (argv, working
directory, one environment variable, with ``--show-torch-threads`` torch's thread count), starts
a child of its own (vLLM's engine core), then serves until SIGTERM (exit 3), or exits at once
with ``--exit N``, or raises with ``--raise``."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--exit", type=int)
    parser.add_argument("--show-env", default="JOB_MARK")
    parser.add_argument("--show-torch-threads", action="store_true")
    parser.add_argument("--raise", dest="raises", action="store_true")
    args = parser.parse_args()
    if args.exit is not None:
        sys.exit(args.exit)
    if args.raises:
        raise RuntimeError("the double raised")
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    signal.signal(signal.SIGTERM, lambda *_: (engine.kill(), sys.exit(3)))
    threads = f" torch_threads={sys.modules['torch'].get_num_threads()}" \
        if args.show_torch_threads else ""
    print(f"argv={sys.argv[1:]} cwd={os.getcwd()} env={os.environ.get(args.show_env)} "
          f"server={os.getpid()} engine={engine.pid}{threads}", flush=True)
    while True:
        time.sleep(1)
