"""Soak: a simulated sweep of 1,000+ trials through the whole stack on this machine (run on demand; prints
figures, asserts nothing).

    python tests/benchmarks/bench_soak.py [--trials 1024] [--cpus 2] [--sampler random] [--every 5]

One ``run_search`` (Ray Tune + the cell searcher + MLflow on sqlite) over 16 cells (4 budgets x r = 1, 2, 4, 8)
of ``trials / 16`` trials each, in a private temp folder. Every ``--every`` seconds a sampler thread records
the trials finished (receipts written), the CPU time and resident memory (VmRSS) of the driver (this process,
less the sampler's own CPU time: it walks the growing stores) and of the Ray processes this sweep started, the
MLflow store on disk (database, WAL and artifacts) and Tune's storage on disk. It prints:

* trials per minute over the whole sweep and per tenth of it, and the CPU seconds per trial of the driver and
  of Ray per tenth: on a shared machine the wall-clock rate also moves with other people's jobs, CPU time per
  trial much less, so a per-trial cost that grows with the trials finished shows in the CPU figures. The
  tenths end when the last trial has finished; the driver's wrap-up after it (result grid, final table,
  closing the sweep) is printed apart, as it is paid once, not per trial;
* the samples over time;
* growth per trial (least-squares slope against trials finished, over the second half, after warm-up) of
  memory, store size and Tune storage, and of the CPU seconds per trial over the tenths after the first,
  extrapolated linearly to 10,000 trials;
* a verdict: whether that growth would stop a 10,000-trial sweep on this machine (memory beyond what is
  available, a store beyond the free disk, or the driver's and Ray's CPU per trial together grown past 10x
  the second tenth's).

The baseline is the sweep's own second tenth (the first includes starting Ray's workers): later figures are
read as ratios to it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import ray  # noqa: E402

from loopscale.search import SweepSpec  # noqa: E402
from loopscale.search.tune.driver import run_search  # noqa: E402
from test_resume import processes_using  # noqa: E402
from test_spec import write_spec  # noqa: E402

CELLS = 16
TARGET = 10_000
MiB = 2**20


@dataclass
class Sample:
    seconds: float
    trials: int
    driver_cpu: float
    ray_cpu: float
    driver_rss: int
    ray_rss: int
    store_bytes: int
    tune_bytes: int


def rss(pid: int | str = "self") -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int | str) -> float:
    """User + system CPU time of a process (fields 14 and 15 of /proc/PID/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_size
    return total


class Sampler(threading.Thread):
    def __init__(self, spec: SweepSpec, ray_dir: str, every: float):
        super().__init__(daemon=True)
        self.spec, self.ray_dir, self.every = spec, ray_dir, every
        self.store = Path(spec.placement.tracking_uri.removeprefix("sqlite:///"))
        self.receipts = Path(spec.placement.storage) / spec.name / "search" / "receipts"
        self.samples: list[Sample] = []
        self.ray_cpu: dict[int, float] = {}  # per Ray process ever seen: its CPU time when last seen alive
        self.stop = threading.Event()
        self.started = time.monotonic()
        self.own_cpu = 0.0  # this thread's CPU time, kept out of the driver's

    def run(self) -> None:
        while not self.stop.wait(self.every):
            started = time.thread_time()
            self.take()
            self.own_cpu += time.thread_time() - started

    def take(self) -> None:
        trials = len([p for p in self.receipts.glob("*.json")]) if self.receipts.exists() else 0
        store = sum(tree_bytes(p) for p in (self.store, Path(f"{self.store}-wal"), Path(f"{self.store}-shm"),
                                             self.store.parent / "artifacts") if p.exists())
        ray_pids = processes_using(self.ray_dir)
        for pid in ray_pids:
            self.ray_cpu[pid] = max(self.ray_cpu.get(pid, 0.0), cpu_seconds(pid))
        self.samples.append(Sample(time.monotonic() - self.started, trials, cpu_seconds("self") - self.own_cpu,
                                   sum(self.ray_cpu.values()), rss(), sum(rss(pid) for pid in ray_pids), store,
                                   tree_bytes(Path(self.spec.placement.storage))))


def sweep_spec(folder: Path, trials: int, sampler: str) -> SweepSpec:
    """16 cells on the tiny CPU template; budgets large enough that every width up to s = 128 is feasible."""
    per_cell = -(-trials // CELLS)
    return SweepSpec.from_toml(write_spec(folder, name="soak", budgets=[1e14, 3e14, 1e15, 3e15],
                                          recurrences=[1, 2, 4, 8], trials_per_cell=per_cell, sampler=sampler,
                                          template={"depth": 10}, widths={"s_min": 1, "s_max": 128}))


def slope(x: np.ndarray, y: np.ndarray) -> float:
    """Least-squares growth of y per unit of x."""
    return float(np.polyfit(x, y, 1)[0]) if len(x) >= 2 and np.ptp(x) > 0 else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=1024)
    parser.add_argument("--cpus", type=int, default=2, help="CPUs Ray may use (trials side by side)")
    parser.add_argument("--sampler", default="random", help="the spec's sampler (gp slows with many trials per cell)")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between samples")
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    ray_dir = tempfile.mkdtemp(prefix="lss", dir="/tmp")  # short: Ray's socket paths must stay under 108 bytes
    spec = sweep_spec(folder, args.trials, args.sampler)
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             _temp_dir=ray_dir)
    sampler = Sampler(spec, ray_dir, args.every)
    sampler.take()
    sampler.start()
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()) as out:
        run_search(spec)
    wall = time.perf_counter() - started
    sampler.stop.set()
    sampler.join()
    sampler.take()
    ray.shutdown()
    report(spec, sampler.samples, wall, out.getvalue(), folder, args)
    shutil.rmtree(ray_dir, ignore_errors=True)
    shutil.rmtree(folder, ignore_errors=True)


def report(spec: SweepSpec, samples: list[Sample], wall: float, output: str, folder: Path, args) -> None:
    planned = spec.planned_trials()
    done = output.count("[search ")
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the end (shared machine), "
          f"{args.cpus} trials side by side, sampler {args.sampler}")
    print(f"sweep: {planned} trials planned, {done} reported finished, {wall:.0f} s wall -> "
          f"{60 * done / wall:.0f} trials per minute overall")

    # the driver's work after the last trial (final table, result grid, closing the sweep) is not per trial:
    # the tenths end at the first sample that saw every trial finished, and the wrap-up is reported apart
    finished = next(s for s in samples if s.trials >= planned)
    print(f"wrap-up after the last trial: {samples[-1].seconds - finished.seconds:.1f} s wall, "
          f"{samples[-1].driver_cpu - finished.driver_cpu:.1f} s driver CPU (once, not per trial)")
    running = [s for s in samples if s.seconds <= finished.seconds]
    n = np.array([s.trials for s in running], dtype=float)

    def per_tenth(values: list[float]) -> np.ndarray:
        """Increase of ``values`` per trial over each tenth of the trials (linear between samples)."""
        first = {count: value for count, value in zip(n[::-1], values[::-1])}  # earliest sample with that count
        counts = np.array(sorted(first))
        at = np.interp([planned * k / 10 for k in range(11)], counts, [first[c] for c in counts])
        return np.diff(at) / (planned / 10)

    wall_each = per_tenth([s.seconds for s in running])
    cpu_each = {"driver": per_tenth([s.driver_cpu for s in running]),
                "Ray": per_tenth([s.ray_cpu for s in running])}
    print("trials per minute per tenth of the sweep: " + ", ".join(f"{60 / s:.0f}" for s in wall_each)
          + f"  (last tenth / second tenth: {wall_each[1] / wall_each[-1]:.2f})")
    for who, each in cpu_each.items():
        print(f"{who} CPU ms per trial per tenth: " + ", ".join(f"{1e3 * s:.0f}" for s in each)
              + f"  (last tenth / second tenth: {each[-1] / each[1]:.2f})")

    print(f"{'time s':>7} {'trials':>6} {'driver CPU s':>12} {'Ray CPU s':>9} {'driver RSS MiB':>14} "
          f"{'Ray RSS MiB':>11} {'MLflow MiB':>10} {'Tune MiB':>8}")
    step = max(1, len(samples) // 25)
    for s in samples[::step] + ([samples[-1]] if (len(samples) - 1) % step else []):
        print(f"{s.seconds:7.0f} {s.trials:6d} {s.driver_cpu:12.1f} {s.ray_cpu:9.1f} {s.driver_rss / MiB:14.1f} "
              f"{s.ray_rss / MiB:11.1f} {s.store_bytes / MiB:10.2f} {s.tune_bytes / MiB:8.2f}")

    n = np.array([s.trials for s in samples], dtype=float)
    half = (n >= planned / 2) & (n < planned)  # warmed up, and still running
    last = samples[-1]
    print(f"growth per trial over the second half, and at {TARGET:,} trials (linear):")
    verdicts = []
    available = _meminfo("MemAvailable")
    free_disk = shutil.disk_usage(folder).free
    for label, values, limit in (
            ("driver RSS", np.array([s.driver_rss for s in samples], float), available),
            ("Ray processes RSS", np.array([s.ray_rss for s in samples], float), available),
            ("MLflow store", np.array([s.store_bytes for s in samples], float), free_disk),
            ("Tune storage", np.array([s.tune_bytes for s in samples], float), free_disk)):
        each = slope(n[half], values[half])
        projected = values[-1] + max(each, 0.0) * (TARGET - last.trials)  # a shrinking figure stays put
        print(f"  {label:<18} {each / 1024:9.2f} KiB/trial -> {projected / MiB:9.1f} MiB "
              f"(now {values[-1] / MiB:.1f} MiB; limit here {limit / MiB:,.0f} MiB)")
        if projected > limit:
            verdicts.append(f"{label} would reach {projected / MiB:,.0f} MiB, beyond the {limit / MiB:,.0f} MiB here")

    middles = planned * (np.arange(1, 10) + 0.5) / 10
    # the verdict is on the two together: Ray's few ms per trial alone are too small a base for a 10x rule
    orchestration = cpu_each["driver"] + cpu_each["Ray"]
    for label, each in (("wall time", wall_each), ("driver CPU", cpu_each["driver"]), ("Ray CPU", cpu_each["Ray"]),
                        ("driver + Ray CPU", orchestration)):
        growth = slope(middles, each[1:])  # seconds per trial gained per trial finished, after the first tenth
        at_target = each[-1] + max(growth, 0.0) * (TARGET - planned)
        print(f"  {label + ' per trial':<18} {1e3 * each[-1]:.0f} ms in the last tenth ({1e3 * each[1]:.0f} ms in "
              f"the second), {growth * 1e6:+.1f} us per finished trial -> {1e3 * at_target:.0f} ms at {TARGET:,}")
        if label == "wall time":
            total = wall + (TARGET - planned) * (each[-1] + at_target) / 2  # growing linearly in between
            print(f"  {'':<18} a {TARGET:,}-trial sweep would take ~{total / 3600:.1f} h here at that rate")
        elif label == "driver + Ray CPU" and at_target > 10 * each[1]:
            verdicts.append(f"{label} per trial would grow to {1e3 * at_target:.0f} ms, over 10x the second "
                            f"tenth's {1e3 * each[1]:.0f} ms")
    print("verdict: " + ("; ".join(verdicts) + " -> growth WOULD stop a 10,000-trial sweep" if verdicts else
                         "no growth that would stop a 10,000-trial sweep on this machine"))


def _meminfo(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    return 0


if __name__ == "__main__":
    main()
