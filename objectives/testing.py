"""Test aids of a trial: they exercise the search machinery (scheduling, crashes, retries, concurrent logging)
with real processes and no mocks, and never change the loss of a trial that completes. A simulated trial takes
all of them; a trained one the aids of timing alone (``TIMING``: delay, journal, rendezvous, the holds), which
leave its training untouched, so that a test can make real training trials overlap, finish in an order it
chooses, or stay unfinished until it has killed them.

A spec sets them in a ``[testing]`` table, which is refused unless the environment says ``LOOPSCALE_TESTING=1``
(the test suite and its benchmarks set it): a production spec cannot trip them, and they are not part of the
spec hash. The trial config carries them under one key, ``testing``:

* ``delay_s``: seconds the trial sleeps before it returns, so that trials overlap and a driver can be killed
  while some are running, as with real training.
* ``journal``: a JSONL file; every execution appends ``{"event": "start" | "end", "budget_flops", "r", "s",
  "pid", "time"}`` (one ``write`` of one line with O_APPEND, so concurrent trials on one machine do not
  interleave). It counts how often each trial really ran. With ``end_order`` the searcher adds a "proposed"
  event for each trial it proposes (its pid the driver's).
* ``faults``: in the spec ``{"<cell key>/s=<s>": action}``, in the trial config ``{"<s>": action}`` for the
  trial's cell (s written with ``%g``); the trial at that width ``raise``\\ s a RuntimeError, returns ``nan``
  as its loss with status "ok" (an objective that does not catch its own divergence), dies by ``sigkill`` of
  its own process (as the out-of-memory killer does), or ``exit``\\ s its worker process at once
  (``os._exit(1)``, a worker that dies). ``<action>-once`` acts only on the trial's first execution in the
  journal (its retries then succeed), so bounded retries can be told from endless ones.
* ``rendezvous``: N (needs ``journal``); an execution, once journaled, waits until the journal holds N starts,
  raising after ``RENDEZVOUS_TIMEOUT_S``. The first N trials then run at the same time, each holding its
  resources: on a cluster whose nodes hold one trial each they land on N different nodes, however slowly
  the nodes start their trial processes.
* ``hold``: a path; an execution waits before its delay while that path exists (raising after
  ``RENDEZVOUS_TIMEOUT_S``). A test creates the file to keep a sweep running for as long as it looks at it, and
  removes it to let the sweep go on: a still-running sweep that no machine load can finish early.
* ``hold_end``: a path; an execution that has trained or simulated waits, before it returns (and so before its
  receipt), while that path exists (raising after ``RENDEZVOUS_TIMEOUT_S``): a trial a test kills after its
  first checkpoint is then still unfinished, however fast the machine trained it.
* ``end_order``: "ascending" or "descending" (needs ``journal``): executions end in that order of (width s,
  budget, r) within each set of trials running together, whatever their speeds. The searcher journals each trial
  as it proposes it (``proposed``); an execution that has trained or simulated waits, before it returns, until
  every proposed trial that comes first has ended, and then until ``END_GAP_S`` after the journal's last end, so
  that the driver takes their results in that order too (raising after ``RENDEZVOUS_TIMEOUT_S``: every
  execution must end, none may fail). Proposing in rounds, a round's trials are all proposed before any of them
  ends, so each round ends in that order exactly: no sleep that a loaded machine could outlast decides it.
* ``fill_disk``: a path. An execution that ends while ``<fill_disk>.armed`` exists removes that file, then fills
  the file system holding ``fill_disk`` to its last byte (writing ``fill_disk`` until ENOSPC) just before it
  returns: a disk that is full at the moment a trial ends, which a test cannot time from outside the trial
  (its sleep and its writes race the trial's ``delay_s`` on a loaded machine).
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .checks import did_you_mean, require

if TYPE_CHECKING:
    from .trial import TrialConfig

TESTING_ENV = "LOOPSCALE_TESTING"
KEYS = ("delay_s", "journal", "rendezvous", "hold", "hold_end", "end_order", "faults", "fill_disk")
TIMING = ("delay_s", "journal", "rendezvous", "hold", "hold_end", "end_order")  # the aids of a trained trial
ARMED = ".armed"  # fill_disk's trigger: the path with this suffix
MIB = 1 << 20
FAULTS = ("raise", "nan", "sigkill", "exit")
FAULT_ONCE = "-once"
RENDEZVOUS_TIMEOUT_S = 300.0
END_ORDERS = ("ascending", "descending")
END_GAP_S = 0.5  # between two ends in ``end_order``: far above the driver's time to take one result


# ---- the spec's [testing] table ----------------------------------------------------------------------------
def parse_aids(table: dict[str, Any], widths: dict[str, tuple[float, ...]], objective: str) -> dict[str, Any]:
    """Validate ``[testing]`` (one ValueError line per mistake); ``widths`` maps each cell key to the widths it
    may try. Returns the aids with the journal path absolute and the fault keys normalised."""
    if os.environ.get(TESTING_ENV) != "1":
        raise ValueError(f"[testing] is for loopscale's own tests (set {TESTING_ENV}=1 to use it)")
    require(isinstance(table, dict), "[testing] must be a table")
    for key in table:
        require(key in KEYS, f"unknown key {key!r} in [testing]{did_you_mean(key, KEYS)}; "
                             f"known keys: {', '.join(KEYS)}")
    beyond = [k for k in table if k not in TIMING and table[k] != {}]  # an empty faults table asks for none
    require(objective == "simulate" or not beyond, f"[testing] {', '.join(beyond)} apply to the simulated "
                                                    f"objective only; a trained trial takes {', '.join(TIMING)}")
    delay_s, journal = table.get("delay_s", 0.0), table.get("journal")
    rendezvous, faults = table.get("rendezvous", 0), table.get("faults", {})
    require(_number(delay_s) and 0 <= delay_s < math.inf, f"[testing] delay_s must be >= 0 seconds, got {delay_s!r}")
    require(journal is None or isinstance(journal, str), f"[testing] journal must be a path, got {journal!r}")
    require(isinstance(rendezvous, int) and not isinstance(rendezvous, bool) and rendezvous >= 0,
             f"[testing] rendezvous must be >= 0 trials, got {rendezvous!r}")
    require(rendezvous <= 1 or journal is not None, "[testing] rendezvous needs [testing] journal to count the "
             "trials that started")
    order = table.get("end_order")
    require(order is None or order in END_ORDERS,
            f"[testing] end_order must be {' or '.join(END_ORDERS)}, got {order!r}")
    require(order is None or journal is not None, "[testing] end_order needs [testing] journal to see the "
            "trials proposed and ended")
    require(isinstance(faults, dict), "[testing] faults must be a table")
    for key in ("fill_disk", "hold", "hold_end"):
        require(table.get(key) is None or isinstance(table[key], str),
                f"[testing] {key} must be a path, got {table.get(key)!r}")
    aids: dict[str, Any] = {"delay_s": float(delay_s), "rendezvous": rendezvous, "end_order": order,
                            "faults": _parse_faults(faults, widths, journal is not None)}
    for key in ("journal", "hold", "hold_end", "fill_disk"):
        if table.get(key) is not None:
            aids[key] = str(os.path.abspath(os.path.expanduser(table[key])))  # trials run in other directories
    return {k: v for k, v in aids.items() if v}


def _parse_faults(table: dict[str, Any], widths: dict[str, tuple[float, ...]], journal: bool) -> dict[str, str]:
    actions = (*FAULTS, *(f"{a}{FAULT_ONCE}" for a in FAULTS))
    faults = {}
    for selector, action in table.items():
        cell, _, s = selector.partition("/s=")
        require(cell in widths, f"[testing] faults: {selector!r} names no cell; use \"<cell>/s=<s>\" with a cell "
                                 f"of {', '.join(widths)}")
        try:
            width = float(s)
        except ValueError:
            raise ValueError(f"[testing] faults: {selector!r} has no width after '/s='") from None
        require(width in widths[cell], f"[testing] faults: s={width:g} is not a width of cell {cell} "
                                        f"({', '.join(f'{w:g}' for w in widths[cell])})")
        require(action in actions, f"[testing] faults: {action!r} is not a fault; use {', '.join(actions)}")
        require(not action.endswith(FAULT_ONCE) or journal,
                 f"[testing] faults: {action!r} needs [testing] journal to remember the first execution")
        faults[f"{cell}/s={width:g}"] = action
    return faults


def trial_aids(aids: dict[str, Any] | None, cell_key: str) -> dict[str, Any]:
    """The aids of one trial config of cell ``cell_key``: its faults keyed by width alone."""
    if not aids:
        return {}
    prefix = f"{cell_key}/s="
    faults = {k.removeprefix(prefix): v for k, v in aids.get("faults", {}).items() if k.startswith(prefix)}
    return {k: v for k, v in {**aids, "faults": faults}.items() if v}


# ---- in the trial --------------------------------------------------------------------------------------------
def before_trial(trial: TrialConfig) -> str:
    """Journal the start, wait at the rendezvous, inject the fault, sleep; returns "nan" when the trial's loss is
    to be NaN, else ""."""
    aids = trial.testing or {}
    if not aids:
        return ""
    earlier = _journal(trial, aids, "start")
    _rendezvous(aids)
    _hold(aids.get("hold"))
    fault = _fault(trial, aids, earlier)
    time.sleep(float(aids.get("delay_s", 0.0)))
    return fault


def after_trial(trial: TrialConfig) -> None:
    """Wait while ``hold_end`` exists, and for the trials ``end_order`` puts first; journal the end; fill the disk
    if ``fill_disk`` is armed (module docstring)."""
    aids = trial.testing or {}
    _hold(aids.get("hold_end"))
    _in_order(trial, aids)
    if aids:
        _journal(trial, aids, "end")
    if aids.get("fill_disk"):
        try:
            os.unlink(aids["fill_disk"] + ARMED)
        except FileNotFoundError:  # not armed, or another trial took it
            return
        fill_to_zero(aids["fill_disk"])


def fill_to_zero(path: str) -> None:
    """Append to ``path`` until its file system has no byte left (a MiB, then a page at a time, unbuffered, so
    nothing is left in a buffer to fail later)."""
    with open(path, "ab", buffering=0) as f:
        for chunk in (MIB, 4096):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError:
                pass


def _fault(trial: TrialConfig, aids: Mapping[str, Any], earlier_runs: int) -> str:
    action = aids.get("faults", {}).get(f"{trial.s:g}", "")
    if action.endswith(FAULT_ONCE):
        if "journal" not in aids:
            raise ValueError(f"fault {action!r} needs a journal to tell the first execution from the others")
        action = action.removesuffix(FAULT_ONCE) if earlier_runs == 0 else ""
    if action and action not in FAULTS:
        raise ValueError(f"unknown fault {action!r}; use one of {', '.join(FAULTS)}, optionally with {FAULT_ONCE!r}")
    where = f"C={trial.budget_flops:.3g}, r={trial.r}, s={trial.s:g}"
    if action == "raise":
        raise RuntimeError(f"injected fault: the trial at {where} raised")
    if action == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "exit":
        os._exit(1)
    return action


def _journal(trial: TrialConfig, aids: Mapping[str, Any], event: str) -> int:
    """Append ``event`` for this trial to the journal (if any); returns how many times it had started before."""
    path = aids.get("journal")
    if not path:
        return 0
    ident = {"budget_flops": trial.budget_flops, "r": trial.r, "s": trial.s}
    earlier = _starts(path, ident) if event == "start" else 0
    line = json.dumps({"event": event, **ident, "pid": os.getpid(), "time": time.time()}) + "\n"
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return earlier


def proposed(trial: TrialConfig) -> None:
    """The searcher's note that it proposed ``trial``, for ``end_order`` (module docstring)."""
    aids = trial.testing or {}
    if aids.get("end_order"):
        _journal(trial, aids, "proposed")


def _in_order(trial: TrialConfig, aids: Mapping[str, Any]) -> None:
    """Wait until every proposed trial that ``end_order`` puts before this one has ended, then until
    ``END_GAP_S`` after the last end."""
    if not aids.get("end_order"):
        return
    descending = aids["end_order"] == "descending"
    place = (trial.s, trial.budget_flops, trial.r)
    deadline = time.monotonic() + RENDEZVOUS_TIMEOUT_S
    while True:
        entries = _entries(aids["journal"])
        open_ = Counter()
        for e in entries:
            open_[(e["s"], e["budget_flops"], e["r"])] += {"proposed": 1, "end": -1}.get(e["event"], 0)
        first = sorted(k for k, n in open_.items() if n > 0 and (k > place if descending else k < place))
        if not first:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"end_order: trials (s, budget, r) {first} did not end within "
                               f"{RENDEZVOUS_TIMEOUT_S:g} s")
        time.sleep(0.05)
    last_end = max((e["time"] for e in entries if e["event"] == "end"), default=0.0)
    time.sleep(max(0.0, last_end + END_GAP_S - time.time()))


def _entries(path: str) -> list[dict[str, Any]]:
    """The journal's whole lines (one cut short by a kill is left out); none while it does not exist."""
    entries = []
    if not os.path.exists(path):
        return entries
    with open(path) as f:
        for line in f:
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return entries


def _rendezvous(aids: dict[str, Any]) -> None:
    """Wait until the journal holds ``rendezvous`` starts of any trial (see the module docstring)."""
    want = int(aids.get("rendezvous", 0))
    if want <= 1:
        return
    deadline = time.monotonic() + RENDEZVOUS_TIMEOUT_S
    while (started := _starts(aids["journal"])) < want:
        if time.monotonic() > deadline:
            raise RuntimeError(f"rendezvous: {started} of {want} trials started within {RENDEZVOUS_TIMEOUT_S:g} s")
        time.sleep(0.05)


def _hold(path: str | None) -> None:
    """Wait while the file ``path`` exists (``hold`` and ``hold_end`` in the module docstring)."""
    deadline = time.monotonic() + RENDEZVOUS_TIMEOUT_S
    while path and os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"hold: {path} still there after {RENDEZVOUS_TIMEOUT_S:g} s")
        time.sleep(0.05)


def _starts(path: str, ident: dict[str, Any] | None = None) -> int:
    """Start events in the journal: of the trial ``ident`` (budget_flops, r, s), or of any trial."""
    return sum(e.get("event") == "start" and all(e.get(k) == v for k, v in (ident or {}).items())
               for e in _entries(path))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
