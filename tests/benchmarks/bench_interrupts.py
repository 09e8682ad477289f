"""Interruptions at random points: does any trial get lost, run twice, or a sweep reported complete too early?
(Run on demand; it measures correctness, not speed, so a loaded machine is fine. Prints counts, asserts nothing.)

    python tests/benchmarks/bench_interrupts.py [--seeds 0-6] [--per-seed 3]

Per seed: a simulated sweep (6 cells x 2 widths on the grid, trials of ~0.4 s that journal each execution) is
run by a real ``loopscale search`` subprocess and interrupted ``--per-seed`` times, each time by one of

* SIGINT or SIGTERM to the driver (a clean stop is expected: exit 130 / 143),
* SIGKILL of the driver (and of what its Ray leaves behind),
* a store failure: another program holds the sqlite store's write lock past MLflow's busy timeout (a clean
  stop with one line is expected, exit 1),
* a full disk: the sweep's Tune storage, a 48 MiB tmpfs, filled to its last byte at once (a clean stop with
  one line is expected, exit 1; Tune's state may be left truncated), space freed once the driver has ended,
* a cut state: SIGKILL of the driver, then Tune's state files truncated to half (as a disk filling up while
  Tune copies them leaves them),

at a point drawn from the seed: some seconds after launch, or after some more trials plus a fraction of one.
Each interruption is followed by ``--resume``; after the last, one more ``--resume`` runs the sweep to its end.

Counted over all interruption points:
* lost: a planned trial without a FINISHED run at the end, or a run MLflow held FINISHED at an interruption
  that is gone or replaced at the end;
* run twice: a trial the journal shows completing more than once, or starting again after MLflow held it
  FINISHED;
* complete too early: an interrupted driver that exited 0, or a sweep.json marked complete while MLflow lacked
  a planned trial's finished run;
* unclean: a clean stop (SIGINT, SIGTERM, store failure) whose output holds a traceback or whose exit code is
  not the documented one.

It also counts the trials that ended on a full disk and whose receipt reached --resume through their MLflow run
(``receipts via MLflow``: the runs carrying one), the path a disk filled to 0 bytes exercises.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from test_interrupts import fill_to_zero  # noqa: E402
from test_kill_resume import Driver, journal, journal_identity, kill_leftovers, trial_runs  # noqa: E402
from test_spec import base_spec, to_toml  # noqa: E402

from loopscale.objectives.testing import TESTING_ENV  # noqa: E402
from loopscale.search import SweepSpec  # noqa: E402
from loopscale.search.tracking import RECEIPT_TAG  # noqa: E402
from loopscale.search.tune_state import StateKeeper  # noqa: E402

KINDS = ("SIGINT", "SIGTERM", "SIGKILL", "store", "disk-full", "state-cut")
EXPECTED_EXIT = {"SIGINT": 130, "SIGTERM": 143, "store": 1, "disk-full": 1}


def sweep(folder: Path) -> SweepSpec:
    """The sweep, its Tune storage on a tmpfs of its own (mounted here: root only) for the full-disk kind."""
    folder.mkdir(parents=True)
    (folder / "disk").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(folder / "disk")], check=True)
    spec = base_spec(folder, budgets=[1e12, 1e13], recurrences=[1, 2, 4], sampler="grid", trials_per_cell=2,
                     storage=str(folder / "disk" / "tune"),
                     testing={"delay_s": 0.4, "journal": str(folder / "journal.jsonl")})
    (folder / "spec.toml").write_text(to_toml(spec))
    return SweepSpec.from_toml(folder / "spec.toml")


def finished(spec: SweepSpec) -> dict[str, str]:
    return {r.data.tags["trial_key"]: r.info.run_id for r in trial_runs(spec) if r.info.status == "FINISHED"}


def marked_complete(spec: SweepSpec) -> bool:
    path = Path(spec.placement.storage) / spec.name / "sweep.json"
    return path.exists() and json.loads(path.read_text()).get("complete", False)


def interrupt(spec: SweepSpec, ray_dir: str, rng: random.Random, resume: bool, left: int,
              kinds: list[str]) -> dict:
    """One driver, interrupted at a random point by a random kind; what happened."""
    kind = rng.choice(kinds)
    driver = Driver(spec, ray_dir, resume)
    if rng.random() < 0.2:
        delay = rng.uniform(1.0, 8.0)
        time.sleep(delay)
        point = f"{delay:.1f} s after launch"
    else:
        more, fraction = rng.randint(0, max(0, left // 3)), rng.uniform(0.0, 1.2)
        if not (driver.wait_for("sweep ", 1) and driver.wait_for("[search ", more)):
            point = "after the driver ended by itself"
        else:
            time.sleep(fraction)
            point = f"{more} trials + {fraction:.2f} s after the banner"
    blocker = filler = None
    if driver.process.poll() is None:
        if kind == "store":
            blocker = sqlite3.connect(spec.placement.tracking_uri.removeprefix("sqlite:///"), isolation_level=None,
                                      timeout=60)
            blocker.execute("BEGIN EXCLUSIVE")
        elif kind == "disk-full":
            filler = fill_to_zero(Path(spec.placement.storage).parent)
        else:
            driver.process.send_signal(signal.SIGKILL if kind == "state-cut" else getattr(signal, kind))
    reader = threading.Thread(target=driver.wait_for, args=("never printed", 1, 240))
    reader.start()
    reader.join()
    code = driver.process.wait(timeout=60)
    if blocker is not None:
        blocker.execute("COMMIT")
        blocker.close()
    if filler is not None:
        filler.unlink()
    kill_leftovers(ray_dir)
    if kind == "state-cut":
        for path in StateKeeper(Path(spec.placement.storage) / spec.name / "search").state_files().values():
            path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
    out = "".join(driver.output)
    return {"kind": kind, "point": point, "code": code, "traceback": "Traceback" in out,
            "held": finished(spec), "journal_at": len(journal(spec)), "complete": marked_complete(spec),
            "planned_all_finished": len(finished(spec)) == spec.planned_trials()}


def run_seed(seed: int, per_seed: int, root: Path, kinds: list[str]) -> tuple[Counter, list[dict]]:
    spec = sweep(root / f"seed{seed}")
    ray_dir = tempfile.mkdtemp(prefix="lsb", dir="/tmp")
    rng = random.Random(seed)
    events = []
    for k in range(per_seed):
        events.append(interrupt(spec, ray_dir, rng, resume=k > 0, left=spec.planned_trials() - len(finished(spec)),
                                kinds=kinds))
    final = Driver(spec, ray_dir, resume=True)
    final.wait_for("never printed", 1, timeout_s=400)
    final_code = final.process.wait(timeout=60)
    kill_leftovers(ray_dir)
    subprocess.run(["umount", "-l", str(Path(spec.placement.storage).parent)], check=False)

    counts = Counter()
    planned = {f"search/{c.key}/{n}" for c in spec.cells() for n in range(1, c.n_trials + 1)}
    runs = finished(spec)
    counts["lost"] += len(planned - set(runs))
    entries = journal(spec)
    completed = Counter(journal_identity(e) for e in entries if e["event"] == "end")
    counts["run twice"] += sum(n - 1 for n in completed.values() if n > 1)
    identity = {r.data.tags["trial_key"]: journal_identity({"budget_flops": float(r.data.params["budget_flops"]),
                                                            "r": int(r.data.params["r"]),
                                                            "s": float(r.data.params["s"])})
                for r in trial_runs(spec)}
    for event in events:
        counts["lost"] += sum(1 for key, run in event["held"].items() if runs.get(key) != run)
        held = {identity[key] for key in event["held"] if key in identity}
        counts["run twice"] += sum(1 for e in entries[event["journal_at"]:]
                                   if e["event"] == "start" and journal_identity(e) in held)
        interrupted = event["point"] != "after the driver ended by itself"
        counts["complete too early"] += int(interrupted and event["code"] == 0
                                            and not event["planned_all_finished"])
        counts["complete too early"] += int(event["complete"] and not event["planned_all_finished"])
        if interrupted and event["kind"] in EXPECTED_EXIT:
            counts["unclean"] += int(event["traceback"] or event["code"] != EXPECTED_EXIT[event["kind"]])
        counts["points"] += int(interrupted)
    counts["final exit != 0"] += int(final_code != 0)
    if final_code != 0:
        print("".join(final.output)[-1500:], flush=True)
    counts["receipts via MLflow"] += sum(1 for r in trial_runs(spec) if f"{RECEIPT_TAG}.0" in r.data.tags)
    return counts, events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-6", help="seeds, a range a-b or a comma list (default 0-6)")
    parser.add_argument("--per-seed", type=int, default=3, help="interruptions per seed (default 3)")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"interruption kinds to draw from (default: all, "
                                                                f"{','.join(KINDS)})")
    args = parser.parse_args()
    os.environ[TESTING_ENV] = "1"  # the trials journal and sleep ([testing]), here and in the drivers
    if "-" in args.seeds:
        lo, hi = (int(x) for x in args.seeds.split("-"))
        seeds = list(range(lo, hi + 1))
    else:
        seeds = [int(x) for x in args.seeds.split(",")]
    total, kinds = Counter(), Counter()
    with tempfile.TemporaryDirectory(prefix="bench-interrupts-") as tmp:
        for seed in seeds:
            started = time.monotonic()
            counts, events = run_seed(seed, args.per_seed, Path(tmp), args.kinds.split(","))
            total += counts
            kinds.update(e["kind"] for e in events if e["point"] != "after the driver ended by itself")
            print(f"seed {seed} ({time.monotonic() - started:.0f} s): "
                  + "; ".join(f"{e['kind']} at {e['point']} -> exit {e['code']}, {len(e['held'])} held"
                              for e in events), flush=True)
            print(f"  {dict(counts)}", flush=True)
    print(f"\n{total['points']} interruption points over {len(seeds)} seeds ({dict(kinds)}):")
    for key in ("lost", "run twice", "complete too early", "unclean", "final exit != 0", "receipts via MLflow"):
        print(f"  {key:20s} {total[key]}")


if __name__ == "__main__":
    main()
