"""A sweep stopped early loses no trial and repeats none (issue 14): a signal to the driver, a store that stops
taking writes, a disk that fills up, a second driver of the same sweep.

Every sweep runs as a real ``loopscale search`` subprocess with its own Ray (tests/test_kill_resume.py's
``Driver``), simulated trials of ~0.5 s that journal each execution, and a real sqlite store. After the stop:
one line saying what happened, no traceback, the sweep not marked complete; after ``--resume``: every planned
trial has exactly one run in MLflow, FINISHED, and each trial completed exactly once (the journal), the runs
MLflow held at the stop kept as they were. The disk cases mount a small tmpfs (root only; skipped otherwise).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from loopscale.objectives import simulate, testing
from loopscale.search import SweepSpec
from loopscale.search.stopping import StoreFailure, SweepInterrupted, signals_noted
from loopscale.search.tracking import RECEIPT_TAG, open_sweep
from loopscale.search.tune.receipts import Receipt, restore_receipts
from loopscale.search.tune_state import STATE_FILES, StateKeeper
from loopscale.search.sweep_lock import LOCK_FILE, SweepLock
from test_kill_resume import Driver, journal, journal_identity, ray_dir, trial_runs  # noqa: F401 (a fixture)
from test_resume import processes_using
from test_search_tracking import META, config, tracker
from test_spec import base_spec, to_toml, write_spec

MIB = 2**20
pytestmark = pytest.mark.usefixtures("testing_aids")  # the sweeps' trials journal and sleep ([testing])


def small_sweep(folder: Path, aids: dict | None = None, **overrides) -> SweepSpec:
    """6 cells x 2 widths on the grid (12 trials of ~0.5 s each), with further ``[testing]`` aids."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = base_spec(folder, budgets=[1e12, 1e13], recurrences=[1, 2, 4], sampler="grid", trials_per_cell=2,
                     testing={"delay_s": 0.5, "journal": str(folder / "journal.jsonl"), **(aids or {})},
                     **overrides)
    (folder / "spec.toml").write_text(to_toml(spec))
    return SweepSpec.from_toml(folder / "spec.toml")


def planned(spec: SweepSpec) -> list[str]:
    return sorted(f"search/{c.key}/{n}" for c in spec.cells() for n in range(1, c.n_trials + 1))


def running(spec: SweepSpec, ray_dir: str, trials: int = 3) -> Driver:
    """A fresh driver of ``spec``, once ``trials`` trials have finished (0: once its banner says it runs)."""
    driver = Driver(spec, ray_dir, resume=False)
    assert driver.wait_for("sweep ", 1) and driver.wait_for("[search ", trials), "".join(driver.output)
    return driver


def run_to_end(driver: Driver, timeout_s: float = 300) -> tuple[int, str]:
    assert not driver.wait_for("never printed", 1, timeout_s=timeout_s)  # read to the end
    return driver.process.wait(timeout=30), "".join(driver.output)


def finished_runs(spec: SweepSpec) -> dict[str, str]:
    return {r.data.tags["trial_key"]: r.info.run_id for r in trial_runs(spec) if r.info.status == "FINISHED"}


def state_of(spec: SweepSpec) -> dict:
    return json.loads((Path(spec.placement.storage) / spec.name / "sweep.json").read_text())


def run_identity(run) -> tuple[str, float]:
    """The journal's name of the trial an MLflow run logged."""
    return journal_identity({k: float(run.data.params[k]) for k in ("budget_flops", "s")}
                            | {"r": int(run.data.params["r"])})


def resume_and_check_each_trial_once(spec: SweepSpec, ray_dir: str, held: dict[str, str]) -> str:
    """--resume to the end; then one FINISHED run per planned trial, those held before kept, each trial
    completed exactly once, and none that MLflow held finished at the stop executed again. The output."""
    stopped_at = len(journal(spec))
    code, out = run_to_end(Driver(spec, ray_dir, resume=True))
    assert code == 0 and "complete; fit it with" in out, out[-3000:]
    runs = trial_runs(spec)
    assert sorted(r.data.tags["trial_key"] for r in runs) == planned(spec)
    assert all(r.info.status == "FINISHED" and r.data.tags["status"] == "ok" for r in runs)
    assert {key: finished_runs(spec)[key] for key in held} == held  # nothing held at the stop was replaced
    completed = Counter(journal_identity(e) for e in journal(spec) if e["event"] == "end")
    assert len(completed) == len(planned(spec)) and set(completed.values()) == {1}, completed
    started_again = {journal_identity(e) for e in journal(spec)[stopped_at:] if e["event"] == "start"}
    assert not started_again & {run_identity(r) for r in runs if r.data.tags["trial_key"] in held}
    assert state_of(spec)["complete"] is True
    return out


def stopped_cleanly(spec: SweepSpec, code: int, out: str, expected_code: int, *fragments: str) -> dict[str, str]:
    """The driver's exit code, its last line (holding ``fragments``), no traceback, the sweep not complete, no
    trial blamed for the stop; returns the runs MLflow holds FINISHED."""
    assert code == expected_code, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith("loopscale: "), out[-3000:]
    for fragment in fragments:
        assert fragment in last, last
    assert state_of(spec)["complete"] is False
    assert not [r for r in trial_runs(spec) if r.info.status == "FAILED"]
    return finished_runs(spec)


# ---- 1. SIGINT / SIGTERM to the driver, and a Tune state a full disk cut short -----------------------------
@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("signum,cut,second", [(signal.SIGINT, "truncated", []),
                                               (signal.SIGTERM, "missing", ["--resume"])],
                         ids=["SIGINT-truncated", "SIGTERM-missing"])
def test_a_signal_stops_the_sweep_cleanly_and_resume_logs_every_trial_once_from_any_state(tmp_path, ray_dir,
                                                                                          signum, cut, second):
    """A second driver of a running sweep (with or without --resume) exits 2 in one line naming the first. Either
    signal stops the running sweep in one line, the trials finished so far kept. Then its Tune experiment
    state and searcher pickle are damaged as a disk filling up during Tune's in-place copy leaves them (cut to
    half their bytes or to none, the files taking turns) or gone, where --resume used to say the state was damaged
    and could not continue the stage: it resumes from the last readable copy, every trial logged once, and the
    sweep's lock is released."""
    hold = tmp_path / "hold"
    hold.touch()  # no trial ends while the second driver tries
    spec = small_sweep(tmp_path / "sweep", {"hold": str(hold)})
    driver = running(spec, ray_dir, trials=0)  # its banner: it holds the lock and runs
    refused = loopscale("search", spec.source, *second, cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.count("\n") == 1 and f"already being run by pid {driver.process.pid}" in refused.stderr
    hold.unlink()
    assert driver.wait_for("[search ", 6), "".join(driver.output)
    driver.process.send_signal(signum)
    code, out = run_to_end(driver, timeout_s=120)
    name = signal.Signals(signum).name
    held = stopped_cleanly(spec, code, out, 128 + signum, f"interrupted by {name}", "--resume")
    assert 6 <= len(held) < len(planned(spec))
    keeper = StateKeeper(stage_folder(spec))
    assert sorted(keeper.state_files()) == sorted(STATE_FILES) and keeper.copies()  # Tune's names, and a copy
    for n, path in enumerate(keeper.state_files().values()):
        if cut == "missing":
            path.unlink()
        else:
            path.write_bytes(path.read_bytes()[:path.stat().st_size // 2 if n % 2 else 0])
    resume_and_check_each_trial_once(spec, ray_dir, held)
    assert not (Path(spec.placement.storage) / spec.name / LOCK_FILE).exists()


# ---- 1b. a signal in the first seconds: imports, the spec, Ray's start --------------------------------------
CONSOLE = Path(sys.executable).parent / "loopscale"  # the console entry point, as a user runs it


def caught_signals(pid: int) -> int:
    """The mask of signals process ``pid`` has handlers for (``SigCgt`` in /proc; 0 once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("SigCgt:")), 16)


def launched(folder: Path, ray_dir: str, resume: bool = False) -> tuple[subprocess.Popen, float]:
    """``loopscale search spec.toml`` through the console script, once loopscale's code holds SIGTERM (before
    that the interpreter itself starts: ~30-50 ms of site imports that run no loopscale code); the seconds
    that took. With Python's fault handler on, so that a crash leaves the Python stack of every thread and
    the interpreter's state ("finalizing") on stderr, which the failed assertion shows (a crash in C's exit
    handlers, issue 14's SIGSEGV, came after the handler was off and left nothing: ``exit_process``)."""
    command = [str(CONSOLE)] if CONSOLE.exists() else [sys.executable, "-m", "loopscale.search.cli"]
    started = time.monotonic()
    env = {**os.environ, "RAY_TMPDIR": ray_dir, "PYTHONFAULTHANDLER": "1"}
    process = subprocess.Popen([*command, "search", "spec.toml", *(["--resume"] if resume else [])], cwd=folder,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    while not caught_signals(process.pid) & (1 << (signal.SIGTERM - 1)):
        assert process.poll() is None and time.monotonic() - started < 60, process.communicate()
        time.sleep(0.001)
    return process, time.monotonic() - started


def stopped_in_one_line(process: subprocess.Popen, signum: int, folder: Path, ray_dir: str) -> str:
    """The command's exit code 128 + signum, one line on stderr and no traceback; nothing written unless the
    line says to --resume; no process left of a Ray it was starting. The line."""
    out, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signum, (err, out[-2000:])
    assert err.startswith(f"loopscale: interrupted by {signal.Signals(signum).name}") and err.count("\n") == 1, err
    assert "Traceback" not in out + err, out[-2000:]
    if "--resume" not in err:
        assert sorted(p.name for p in folder.iterdir()) == ["spec.toml"]  # no store, no Tune state, no lock
    deadline = time.monotonic() + 20
    while (left := processes_using(ray_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, left  # a Ray that was starting is shut down
    return err


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_command_imports_is_one_line_and_its_exit_code(tmp_path, ray_dir, signum):
    """torch, MLflow and Ray take seconds to import; a signal then was a KeyboardInterrupt traceback (SIGINT)
    or a silent death (SIGTERM)."""
    small_sweep(tmp_path / "sweep")
    for after_s in (0.0, 0.05, 0.3, 1.0):
        process, _ = launched(tmp_path / "sweep", ray_dir)
        time.sleep(after_s)
        process.send_signal(signum)
        assert "--resume" not in stopped_in_one_line(process, signum, tmp_path / "sweep", ray_dir)


def test_a_signal_whose_exception_python_swallows_is_still_noted_and_not_reported():
    """Python ignores an exception raised inside a __del__ (and inside logging's lock release, where 2 of 40
    SIGTERMs during ray.init were lost and the sweep ran to its end with exit 0): the handler ran, its
    exception is gone, and ``signals_noted`` still has the signal. Python's report of it ("Exception ignored
    in", a traceback on stderr before the one line: 2 of 80 SIGTERMs while Ray started) is dropped; any other
    swallowed exception is still reported until a signal arrives, and dropped after it (its consequence: a fork
    hook the signal cut short failing in the next, once in a suite while Ray started)."""
    def raising(signum, frame):
        raise SweepInterrupted(signum, "interrupted")

    class Swallowing:
        def __init__(self, raises):
            self.raises = raises

        def __del__(self):
            self.raises()

    reported = []
    previous = signal.signal(signal.SIGTERM, raising)
    previous_hook, sys.unraisablehook = sys.unraisablehook, reported.append
    try:
        with signals_noted() as noted:
            Swallowing(lambda: 1 / 0)  # before any signal: reported
            Swallowing(lambda: signal.raise_signal(signal.SIGTERM))  # the handler runs here; its exception dropped
            Swallowing(lambda: [].pop())  # after it: dropped
        assert noted == [signal.SIGTERM]
        assert [type(r.exc_value) for r in reported] == [ZeroDivisionError]
        assert sys.unraisablehook == reported.append  # put back
        with signals_noted() as quiet:
            pass
        assert quiet == []
    finally:
        signal.signal(signal.SIGTERM, previous)
        sys.unraisablehook = previous_hook


def test_the_console_exit_skips_native_exit_handlers_and_keeps_what_a_python_exit_does():
    """``exit_process`` (the console script's exit) ends without C's ``exit``, whose handlers crashed in Ray's
    (issue 14): a C exit handler registered here does not run. What a normal exit does in Python still
    happens: a non-daemon thread finishes, atexit handlers run after it, block-buffered output reaches the
    pipe, and the exit code is kept."""
    script = textwrap.dedent("""
        import atexit, ctypes, sys, threading, time
        from loopscale.search.cli import exit_process

        libc = ctypes.CDLL(None)
        # how C and C++ register exit handlers (Ray's among them); C's exit would abort here: SIGABRT, not 7
        libc.__cxa_atexit(ctypes.cast(libc.abort, ctypes.c_void_p), None, None)

        def late():
            time.sleep(0.3)
            print("thread finished", end="; ")

        atexit.register(print, "atexit handler ran")
        threading.Thread(target=late).start()
        print("buffered", end="; ")
        sys.stderr.write("unflushed")
        exit_process(7)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (7, "buffered; thread finished; atexit handler ran\n",
                                                           "unflushed")


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.waits
def test_signals_while_ray_starts_and_once_the_sweep_runs_leave_it_resumable(tmp_path, ray_dir):
    """Ray's start replaces the SIGTERM handler with sys.exit(15), then a C++ one that aborts
    (exit -6 and a stack dump); a signal there is still one line and 130/143. Then a signal once the banner is
    out, and --resume completes the sweep with each trial once. Until the console script exited without C's
    exit handlers (``search.cli.exit_process``), the process then died of SIGSEGV in Ray's in about one CI run
    in three."""
    spec = small_sweep(tmp_path / "sweep")
    said = ""
    # moments of Ray's start, by what it has written (not by seconds, which change with the machine and the
    # driver's own start-up): its session folder (processes starting), its raylet's socket (up, the driver
    # connecting)
    for signum, written in ((signal.SIGTERM, "ray/session_*"), (signal.SIGINT, "ray/session_*/sockets/raylet"),
                            (signal.SIGTERM, "ray/session_*/sockets/raylet")):
        # a stop that wrote the sweep's state said to --resume it, which the next launch then does
        earlier = set(Path(ray_dir).glob(written))  # an earlier launch's Ray left its session folder
        process, _ = launched(tmp_path / "sweep", ray_dir, resume="--resume" in said)
        while not set(Path(ray_dir).glob(written)) - earlier:
            assert process.poll() is None, process.communicate()
            time.sleep(0.005)
        process.send_signal(signum)
        said = stopped_in_one_line(process, signum, tmp_path / "sweep", ray_dir)
    driver = Driver(spec, ray_dir, resume=True)  # --resume: the state may be written already; else a fresh run
    assert driver.wait_for("sweep ", 1), "".join(driver.output)
    driver.process.send_signal(signal.SIGTERM)
    code, out = run_to_end(driver, timeout_s=120)
    held = stopped_cleanly(spec, code, out, 143, "interrupted by SIGTERM", "--resume")
    resume_and_check_each_trial_once(spec, ray_dir, held)


# ---- 2. the store stops taking writes for a while ----------------------------------------------------------
@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.waits
def test_a_store_that_refuses_writes_stops_the_sweep_in_one_line_and_resume_logs_the_rest(tmp_path, ray_dir):
    """Another program holds the sqlite store's write lock (BEGIN EXCLUSIVE) past MLflow's 20 s busy timeout."""
    spec = small_sweep(tmp_path / "sweep")
    driver = running(spec, ray_dir)
    blocker = sqlite3.connect(spec.placement.tracking_uri.removeprefix("sqlite:///"), isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        code, out = run_to_end(driver, timeout_s=180)
    finally:
        blocker.execute("COMMIT")
        blocker.close()

    held = stopped_cleanly(spec, code, out, 1, "MLflow store", "database is locked", "--resume")
    receipts = list((Path(spec.placement.storage) / spec.name / "search" / "receipts").iterdir())
    assert len(receipts) > len(held)  # trials that finished while the store was locked: only their receipts
    resume_and_check_each_trial_once(spec, ray_dir, held)


# ---- 3. a full disk under the Tune storage -----------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """A 48 MiB tmpfs (a real file system that fills up), unmounted afterwards."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path, leave_bytes: int) -> Path:
    """Write a file that leaves ``leave_bytes`` free on ``disk``."""
    stat = os.statvfs(disk)
    filler = disk / "filler"
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, stat.f_bavail * stat.f_frsize - leave_bytes))
    return filler


def test_the_fill_disk_aid_fills_the_disk_as_an_armed_trial_ends_and_only_then(tmp_path, small_disk):
    filler = small_disk / "filler"
    spec = small_sweep(tmp_path / "sweep", {"fill_disk": str(filler)})
    cell = spec.cells()[0]
    config = spec.trial_config(cell, cell.widths[0])
    plain = simulate(config)
    assert not filler.exists()  # not armed: the trial writes nothing
    armed = Path(f"{filler}{testing.ARMED}")
    armed.touch()
    assert simulate(config)["val_loss"] == plain["val_loss"]
    assert os.statvfs(small_disk).f_bavail == 0 and not armed.exists()  # full, and disarmed for the next trial


def test_a_full_disk_is_refused_before_anything_starts(tmp_path, small_disk, capsys):
    from loopscale.search.cli import main

    fill(small_disk, 2 * MIB)
    spec = small_sweep(tmp_path / "sweep", storage=str(small_disk / "tune"))
    assert main(["search", spec.source]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Tune storage" in err and "MiB free" in err, err
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]  # nothing written there
    assert not Path(spec.placement.tracking_uri.removeprefix("sqlite:///")).exists()


@pytest.mark.slow
@pytest.mark.integration
def test_a_disk_filling_up_mid_sweep_stops_it_cleanly_and_resume_completes(tmp_path, ray_dir, small_disk):
    spec = small_sweep(tmp_path / "sweep", storage=str(small_disk / "tune"))
    driver = running(spec, ray_dir)
    filler = fill(small_disk, 4 * MIB)  # below the room a sweep keeps, above what Tune's next writes take
    code, out = run_to_end(driver, timeout_s=120)

    held = stopped_cleanly(spec, code, out, 1, "Tune storage", "nearly full", "--resume")
    assert not list(small_disk.rglob("*.partial"))
    filler.unlink()
    resume_and_check_each_trial_once(spec, ray_dir, held)


def fill_to_zero(disk: Path) -> Path:
    """Fill ``disk`` to its last byte at once (the simulated trial's own ``fill_disk`` aid does the same)."""
    filler = disk / "filler"
    testing.fill_to_zero(str(filler))
    assert os.statvfs(disk).f_bavail == 0
    return filler


def stage_folder(spec: SweepSpec) -> Path:
    return Path(spec.placement.storage) / spec.name / "search"


@pytest.mark.slow
@pytest.mark.integration
def test_a_disk_filled_to_zero_at_once_mid_sweep_resumes_once_space_is_freed(tmp_path, ray_dir, small_disk):
    """No room left at all, before the free-space watch can stop the sweep: receipts and Tune's state sync
    fail (its state files truncated); a trial that ends then has its MLflow run but no receipt. After space
    is freed, --resume writes that receipt back from the run, and every trial has executed once."""
    filler = small_disk / "filler"
    spec = small_sweep(tmp_path / "sweep", {"fill_disk": str(filler)}, storage=str(small_disk / "tune"))
    driver = running(spec, ray_dir, trials=4)
    armed = Path(f"{filler}{testing.ARMED}")
    armed.touch()  # the next trial to end fills the disk to zero just before it returns (no timing from here)
    code, out = run_to_end(driver, timeout_s=180)
    assert not armed.exists() and filler.exists()  # a trial did fill it

    held = stopped_cleanly(spec, code, out, 1, "--resume")  # a receipt that could not be written, or no room
    filler.unlink()
    carrying = [r for r in trial_runs(spec) if f"{RECEIPT_TAG}.0" in r.data.tags]  # no receipt on disk
    assert carrying  # the case this test is for: a trial ended on the full disk
    out = resume_and_check_each_trial_once(spec, ray_dir, held)
    assert f"{len(carrying)} search trials finished while the disk was full" in out
    assert not list(small_disk.rglob("*.partial"))


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("after_s", [0.1, 0.2])
def test_a_disk_filled_to_zero_as_the_stage_starts_leaves_it_resumable(tmp_path, ray_dir, small_disk, after_s):
    """The disk full before Tune's first state of the stage reached the storage whole (here: its tuner.pkl
    only, or its state files empty, and the Optuna journal's last line cut short): --resume said the stage
    could not be resumed, for good. No trial had ended, so the stage starts afresh."""
    spec = small_sweep(tmp_path / "sweep", storage=str(small_disk / "tune"))
    driver = running(spec, ray_dir, trials=0)
    time.sleep(after_s)
    filler = fill_to_zero(small_disk)
    code, out = run_to_end(driver, timeout_s=180)
    assert code == 1 and "Traceback" not in out, out[-3000:]
    filler.unlink()
    resume_and_check_each_trial_once(spec, ray_dir, held={})


def test_a_receipt_the_disk_refused_rides_on_the_trials_run_and_resume_writes_it_back_whole(tmp_path, small_disk):
    """What run_trial, the driver and --resume do with a receipt a full disk refuses, without Ray: the receipt
    (here longer than one MLflow tag) goes onto the trial's run, and comes back byte for byte as the file
    ``Receipt.save`` writes, into its own stage's folder only, once there is room."""
    spec = SweepSpec.from_toml(write_spec(tmp_path))
    experiment_id, parent = open_sweep(spec, "simulated")
    receipts, key, trial = str(small_disk / "receipts"), "search/C=1e+12,r=1/1", config(2)
    result = {**simulate(trial), "node": "n1", "note": "x" * 9000}
    receipt = Receipt(receipts, key, trial.to_params())
    filler = fill_to_zero(small_disk)
    with pytest.raises(OSError):
        receipt.save(result)
    logger = tracker(spec, experiment_id, parent)
    for k, meta in ((key, META), ("calibrate/C=1e+12,r=1/1", {**META, "stage": "calibrate"})):
        logger.start(k, meta, trial)
        logger.finish(k, result, receipt.carried(result))

    carried = tracker(spec, experiment_id, parent).carried_receipts("search/")  # a resumed driver reads them
    assert carried == [receipt.carried(result)]
    with pytest.raises(StoreFailure, match="cannot write the receipts .* No space left on device"):
        restore_receipts(carried, receipts)
    assert not list(small_disk.rglob("*.partial"))
    filler.unlink()
    assert restore_receipts(carried, receipts) == 1 and restore_receipts(carried, receipts) == 0
    reference = Receipt(str(tmp_path / "reference"), key, trial.to_params())
    reference.save(result)
    assert Path(receipt.path).read_bytes() == Path(reference.path).read_bytes()
    assert sorted(p.name for p in (small_disk / "receipts").iterdir()) == [Path(receipt.path).name]


# ---- 4. a sweep's lock (a second driver of a running sweep: test 1) -------------------------------------------
def test_a_lock_left_by_a_dead_driver_is_broken_and_a_live_one_is_not(tmp_path):
    folder = tmp_path / "sweep"
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = {"host": socket.gethostname(), "pid": gone.pid, "process_start": "1", "since": time.time() - 60}
    folder.mkdir()
    (folder / LOCK_FILE).write_text(json.dumps(stale))
    with SweepLock(folder):  # the holder is dead: its lock is stale
        assert json.loads((folder / LOCK_FILE).read_text())["pid"] == os.getpid()
        with pytest.raises(ValueError, match=f"already being run by pid {os.getpid()} on host"):
            SweepLock(folder).acquire()
    assert not (folder / LOCK_FILE).exists()

    live = subprocess.Popen(["sleep", "30"])
    try:
        from loopscale.search.sweep_lock import process_start

        for holder in ({"host": socket.gethostname(), "pid": live.pid, "process_start": process_start(live.pid)},
                       {"host": "another-machine", "pid": 1, "process_start": ""}):
            (folder / LOCK_FILE).write_text(json.dumps({**holder, "since": time.time()}))
            with pytest.raises(ValueError, match="remove the lock"):
                SweepLock(folder).acquire()
        # the same pid now running another program (a recycled pid) is not the driver
        (folder / LOCK_FILE).write_text(json.dumps({"host": socket.gethostname(), "pid": live.pid,
                                                    "process_start": "1", "since": time.time()}))
        with SweepLock(folder):
            pass
    finally:
        live.kill()
        live.wait()


# ---- 6. no hang ----------------------------------------------------------------------------------------------
def loopscale(*argv: str, cwd: Path, timeout_s: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loopscale.search.cli", *argv], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout_s, env={**os.environ, **(env or {})})


def test_huge_budgets_are_planned_and_exported_without_hanging(tmp_path):
    (tmp_path / "spec.toml").write_text(to_toml(base_spec(tmp_path, budgets=[1e40], recurrences=[1])))
    plan = loopscale("plan", "spec.toml", cwd=tmp_path)
    assert plan.returncode == 0 and "total: 3.00e40 FLOPs" in plan.stdout  # 3 trials, plan.stderr[-2000:]
    export = loopscale("export", "--law", "paper", "--budgets", "1e50", cwd=tmp_path)
    assert export.returncode == 0 and export.stdout.count("\n1e+50,") == 4, export.stderr[-2000:]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens there once the socket closes


@pytest.mark.parametrize("where", ["spec", "env"])
def test_an_unreachable_ray_address_is_one_line_in_seconds(tmp_path, where):
    address = f"127.0.0.1:{closed_port()}"
    (tmp_path / "spec.toml").write_text(to_toml(base_spec(tmp_path, **({"address": address} if where == "spec"
                                                                        else {}))))
    started = time.monotonic()
    done = loopscale("search", "spec.toml", cwd=tmp_path, env={"RAY_ADDRESS": address} if where == "env" else {})
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"Ray cluster at {address} is unreachable" in done.stderr
    assert time.monotonic() - started < 60  # it hung > 150 s before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.toml"]  # nothing written


# ---- 7. Ctrl-C while `loopscale ui` starts -----------------------------------------------------------------
def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rpartition(")")[2].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                pass
    return found


def group_alive(pgid: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_server_is_spawned_waits_until_its_process_is_held(signum):
    """The window the Ctrl-C test below hit under load (9 of 16 servers left running when Ctrl-C came as the
    server appeared): the signal lands while Popen waits for the child's exec. Sent here from the child itself,
    before its exec, so it lands there every time."""
    from loopscale.search.ui import spawn_holding_signals

    leaked: list[int] = []

    def record(n, frame):  # what a signal that got past the function would do: here, harmlessly
        leaked.append(n)

    previous = {s: signal.signal(s, record) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        proc, interrupted = spawn_holding_signals([sys.executable, "-c", "import time; time.sleep(60)"],
                                                  preexec_fn=lambda: os.kill(os.getppid(), signum))
        try:
            assert interrupted and proc.poll() is None and not leaked  # held, reported, and the process is ours
        finally:
            proc.kill()
            proc.wait()
        assert signal.getsignal(signum) is record  # the caller's handlers are back
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@pytest.mark.slow
@pytest.mark.integration
def test_ctrl_c_while_the_ui_starts_leaves_no_server_and_no_traceback(tmp_path):
    from mlflow.tracking import MlflowClient

    from test_spec import free_port

    db = tmp_path / "mlflow.db"
    MlflowClient(f"sqlite:///{db}").search_experiments()  # an MLflow store
    port = free_port()
    ui = subprocess.Popen([sys.executable, "-m", "loopscale.search.cli", "ui", "--tracking-uri", f"sqlite:///{db}",
                           "--port", str(port)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
    deadline = time.monotonic() + 120
    while not (servers := children_of(ui.pid)):
        assert time.monotonic() < deadline and ui.poll() is None, ui.communicate()
        time.sleep(0.05)
    (server,) = servers
    assert str(db) not in Path(f"/proc/{server}/cmdline").read_bytes().decode()  # the store is in its environment
    ui.send_signal(signal.SIGINT)  # MLflow's server needs ~10 s to answer: it is still starting
    out, err = ui.communicate(timeout=60)
    assert ui.returncode == 130 and "Traceback" not in out + err, err
    assert "stopped before it started" in err and "MLflow UI:" not in out
    assert not group_alive(server, wait_s=20)  # the server's whole process group is gone
    with socket.socket() as sock, pytest.raises(OSError):
        sock.settimeout(2)
        sock.connect(("127.0.0.1", port))


@pytest.mark.slow
@pytest.mark.integration
def test_ctrl_c_after_the_ui_served_pages_does_not_say_it_never_started(tmp_path):
    """The server serves pages before loopscale's check of its /health passes (here that check cannot get through:
    a proxy in the environment, which urllib honours for loopback and a direct client does not use); a Ctrl-C then
    says where it was serving, not that it never started."""
    from mlflow.tracking import MlflowClient

    from test_spec import free_port

    db = tmp_path / "mlflow.db"
    MlflowClient(f"sqlite:///{db}").search_experiments()  # an MLflow store
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "no_proxy")}
    env["http_proxy"] = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    ui = subprocess.Popen([sys.executable, "-m", "loopscale.search.cli", "ui", "--tracking-uri", f"sqlite:///{db}",
                           "--port", str(port)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + 80  # inside start_server's 90 s wait for /health
    while True:
        try:
            with direct.open(f"http://127.0.0.1:{port}/", timeout=5) as page:
                assert page.status == 200
                break
        except OSError:  # not listening yet (urllib's URLError is one)
            assert time.monotonic() < deadline and ui.poll() is None, ui.communicate()
            time.sleep(0.2)
    ui.send_signal(signal.SIGINT)
    out, err = ui.communicate(timeout=60)
    assert ui.returncode == 130 and "Traceback" not in out + err, err
    assert "before it started" not in err and f"it was serving on http://127.0.0.1:{port}" in err, err
    with socket.socket() as sock, pytest.raises(OSError):  # and it serves no more
        sock.settimeout(2)
        sock.connect(("127.0.0.1", port))


def test_a_signal_that_an_import_wrapped_in_another_error_is_still_the_signal(capsys):
    """A SIGINT while a class is created (numpy's ``finfo`` at import) reaches the command as RuntimeError
    ("Error calling __set_name__"), an ImportError elsewhere: it was exit 1 with that message (1 CI run under
    load); it is the interrupt's one line and 130."""
    from loopscale.search.cli import _interrupt_behind, _interrupted

    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as interrupt:
            raise RuntimeError("Error calling __set_name__ on 'cached_property' instance") from interrupt
    except RuntimeError as wrapped:
        assert _interrupted(_interrupt_behind(wrapped)) == 128 + signal.SIGINT
    assert capsys.readouterr().err == "loopscale: interrupted by SIGINT\n"
    assert _interrupt_behind(RuntimeError("a store failed")) is None
