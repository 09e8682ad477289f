"""SIGTERMs while Ray starts, on a busy machine: does the command always end with its one line and exit 143?
(Run on demand; it counts exit codes, asserts nothing; a loaded machine is the point.)

    python tests/benchmarks/bench_start_signals.py [--signals 80] [--seed 5] [--window 2.5-8]

Each of ``--signals`` times, ``loopscale search`` of a small simulated sweep (tests/test_interrupts.py's
``small_sweep``) is launched through the console script and sent SIGTERM a uniform random time in ``--window``
seconds after loopscale's code took the signal: mostly while ``ray.init`` connects. Beside it, the whole time,
a second process runs fresh small sweeps one after another (Ray starting and stopping, trial processes), the
load under which a CI run met the SIGSEGV at exit (search/cli.py, exit_process).

Printed: the exit codes (143 expected; -11 is the SIGSEGV in Ray's C exit handler that ``search.cli.exit_process``
avoids) and the commands that did not stop cleanly (``clean``), whose folders are kept with their stderr and,
for a crash, a core (``ulimit -c`` is raised here).
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from test_interrupts import CONSOLE, launched, small_sweep  # noqa: E402
from test_kill_resume import kill_leftovers  # noqa: E402

from loopscale.objectives.testing import TESTING_ENV  # noqa: E402

LOAD = f"""
import os, shutil, subprocess, sys, tempfile
from pathlib import Path
sys.path.insert(0, {str(REPO / 'tests')!r})
from test_interrupts import small_sweep
while True:
    folder = Path(tempfile.mkdtemp(prefix="load", dir=sys.argv[1]))
    small_sweep(folder / "sweep")
    subprocess.run([{str(CONSOLE)!r}, "search", "spec.toml"], cwd=folder / "sweep", capture_output=True,
                   env={{**os.environ, "RAY_TMPDIR": tempfile.mkdtemp(prefix="lsl", dir="/tmp")}})
    shutil.rmtree(folder)
"""


def clean(code: int, err: str) -> bool:
    """Exit 143, and stderr only loopscale's own lines, the last saying it was interrupted (before it, once the
    sweep runs, the line that it is stopping cleanly)."""
    lines = err.splitlines()
    return code == 143 and bool(lines) and all(line.startswith("loopscale: ") for line in lines) \
        and lines[-1].startswith("loopscale: interrupted by SIGTERM")


def window(text: str) -> tuple[float, float]:
    """``--window LOW-HIGH``: seconds, 0 <= LOW < HIGH."""
    try:
        low, high = (float(v) for v in text.split("-"))
        valid = 0 <= low < high
    except ValueError:
        valid = False
    if not valid:
        raise argparse.ArgumentTypeError(f"expected LOW-HIGH seconds with 0 <= LOW < HIGH, got {text!r}")
    return low, high


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signals", type=int, default=80, help="commands to signal (default 80)")
    parser.add_argument("--seed", type=int, default=5, help="seed of the signal times (default 5)")
    parser.add_argument("--window", type=window, default="2.5-8",
                        help="seconds after launch to draw from (default 2.5-8)")
    args = parser.parse_args()
    low, high = args.window

    os.environ[TESTING_ENV] = "1"  # the sweeps' trials sleep ([testing] delay_s)
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    root = Path(tempfile.mkdtemp(prefix="bench-start-signals-"))
    load = subprocess.Popen([sys.executable, "-c", LOAD, str(root)], start_new_session=True)
    rng = random.Random(args.seed)
    codes: Counter = Counter()
    unclean = []
    started = time.monotonic()
    try:
        for i in range(args.signals):
            folder = root / f"signal{i}"
            ray_dir = tempfile.mkdtemp(prefix="lsk", dir="/tmp")
            small_sweep(folder / "sweep")
            process, _ = launched(folder / "sweep", ray_dir)
            after = rng.uniform(low, high)
            time.sleep(after)
            process.send_signal(signal.SIGTERM)
            _, err = process.communicate(timeout=120)
            codes[process.returncode] += 1
            if not clean(process.returncode, err):
                (folder / "stderr.txt").write_text(err)
                unclean.append((i, round(after, 2), process.returncode, str(folder)))
            else:
                shutil.rmtree(folder, ignore_errors=True)
            kill_leftovers(ray_dir)
            shutil.rmtree(ray_dir, ignore_errors=True)
    finally:
        os.killpg(load.pid, signal.SIGKILL)
        load.wait()
        for leftover in [*Path("/tmp").glob("lsl*"), *root.glob("load*")]:
            kill_leftovers(str(leftover))
            shutil.rmtree(leftover, ignore_errors=True)

    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the end; "
          f"{args.signals} SIGTERMs {low}-{high} s after launch, seed {args.seed}, "
          f"{time.monotonic() - started:.0f} s")
    print("exit codes: " + ", ".join(f"{code}: {n}" for code, n in sorted(codes.items())))
    print(f"not the one line and 143: {len(unclean)} of {args.signals}")
    for i, after, code, folder in unclean:
        print(f"  #{i} at {after} s: exit {code}; kept, with its stderr.txt (and a core in sweep/): {folder}")


if __name__ == "__main__":
    main()
