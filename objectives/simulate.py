"""The simulated trial: the joint law evaluated on a trial's exact N_once, N_rec and D, plus seeded deviations.

It returns at once with the same metric keys as a training trial, so a user can replay the paper's 116-run
study, plan a sweep before paying for it, and test the search and the analysis against a known truth.

Deviations from the law (``objectives.noise``): independent noise per trial (``noise``), a per-cell offset
(``cell_noise``) and a smooth per-cell curve in log width (``misspec``), all in nats and all seeded, so the
same trial always gives the same loss: a resumed or repeated sweep reproduces an uninterrupted one exactly.

Testing aids (optional trial-config keys, set from the spec's ``[simulate]`` table; see search/spec.py). They
exist to exercise the search machinery (scheduling, crashes, retries, concurrent logging) with real processes
and no mocks; they never change the loss of a trial that completes:

* ``delay_s``: seconds the trial sleeps before it returns, so that trials overlap and a driver can be killed
  while some are running, as with real training.
* ``journal``: a JSONL file; every execution appends ``{"event": "start" | "end", "budget_flops", "r", "s",
  "pid", "time"}`` (one ``write`` of one line with O_APPEND, so concurrent trials on one machine do not
  interleave). It counts how often each trial really ran.
* ``faults``: ``{"<s>": action}`` for the trial's cell (s written with ``%g``); the trial at that width
  ``raise``\\ s a RuntimeError, returns ``nan`` as its loss with status "ok" (an objective that does not catch
  its own divergence), dies by ``sigkill`` of its own process (as the out-of-memory killer does), or ``exit``\\ s
  its worker process at once (``os._exit(1)``, a worker that dies). ``<action>-once`` acts only on the trial's
  first execution in the journal (its retries then succeed), so bounded retries can be told from endless ones.
* ``rendezvous``: N (needs ``journal``); an execution, once journaled, waits until the journal holds N starts,
  raising after ``RENDEZVOUS_TIMEOUT_S``. The first N trials then run at the same time, each holding its
  resources: on a cluster whose nodes hold one trial each they land on N different nodes, however slowly
  the nodes start their trial processes.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from typing import Any

from loopscale.model import PAPER_LAW, JointLaw

from .noise import Noise
from .trial import accounting_metrics, model_config

FAULTS = ("raise", "nan", "sigkill", "exit")
FAULT_ONCE = "-once"
RENDEZVOUS_TIMEOUT_S = 300.0


def simulate(trial_config: dict[str, Any]) -> dict[str, Any]:
    """Loss of the trial under ``trial_config["law"]`` (default: the paper's fit) with seeded deviations
    (trial-config keys ``noise``, ``cell_noise``, ``misspec``; defaults ``objectives.noise.Noise()``)."""
    config = model_config(trial_config)
    law = JointLaw(**trial_config["law"]) if trial_config.get("law") else PAPER_LAW
    noise = Noise(**{k: float(trial_config[k]) for k in ("noise", "cell_noise", "misspec") if k in trial_config})
    metrics = accounting_metrics(config, trial_config["budget_flops"], int(trial_config["batch_tokens"]))
    if metrics["tokens"] == 0:
        raise ValueError(f"budget {trial_config['budget_flops']:.3g} FLOPs buys no optimizer step at width "
                         f"{config.width}")
    earlier = _journal(trial_config, "start")
    _rendezvous(trial_config)
    fault = _fault(trial_config, earlier)
    time.sleep(float(trial_config.get("delay_s", 0.0)))
    clean = law.loss(metrics["N_once"], metrics["N_rec"], config.r, metrics["tokens"])
    loss = noise.observe(clean, seed=int(trial_config.get("seed", 0)), budget=float(trial_config["budget_flops"]),
                         r=config.r, width=config.width) if fault != "nan" else float("nan")
    nan = float("nan")
    _journal(trial_config, "end")
    return {**metrics, "val_loss": loss, "val_bpb": nan, "train_loss": loss, "s": float(trial_config["s"]),
            "lr": nan, "tokens_per_s": nan, "mfu": nan, "wall_s": 0.0, "status": "ok", "reason": ""}


def _fault(trial_config: dict[str, Any], earlier_runs: int) -> str:
    """Inject the trial's fault, if it has one; returns "nan" when the loss is to be NaN, else ""."""
    action = trial_config.get("faults", {}).get(f"{float(trial_config['s']):g}", "")
    if action.endswith(FAULT_ONCE):
        if "journal" not in trial_config:
            raise ValueError(f"fault {action!r} needs a journal to tell the first execution from the others")
        action = action.removesuffix(FAULT_ONCE) if earlier_runs == 0 else ""
    if action and action not in FAULTS:
        raise ValueError(f"unknown fault {action!r}; use one of {', '.join(FAULTS)}, optionally with {FAULT_ONCE!r}")
    where = f"C={trial_config['budget_flops']:.3g}, r={trial_config['r']}, s={float(trial_config['s']):g}"
    if action == "raise":
        raise RuntimeError(f"injected fault: the trial at {where} raised")
    if action == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "exit":
        os._exit(1)
    return action


def _journal(trial_config: dict[str, Any], event: str) -> int:
    """Append ``event`` for this trial to the journal (if any); returns how many times it had started before."""
    path = trial_config.get("journal")
    if not path:
        return 0
    ident = {"budget_flops": float(trial_config["budget_flops"]), "r": int(trial_config["r"]),
             "s": float(trial_config["s"])}
    earlier = _starts(path, ident) if event == "start" else 0
    line = json.dumps({"event": event, **ident, "pid": os.getpid(), "time": time.time()}) + "\n"
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return earlier


def _rendezvous(trial_config: dict[str, Any]) -> None:
    """Wait until the journal holds ``rendezvous`` starts of any trial (see the module docstring)."""
    want = int(trial_config.get("rendezvous", 0))
    if want <= 1:
        return
    deadline = time.monotonic() + RENDEZVOUS_TIMEOUT_S
    while (started := _starts(trial_config["journal"])) < want:
        if time.monotonic() > deadline:
            raise RuntimeError(f"rendezvous: {started} of {want} trials started within {RENDEZVOUS_TIMEOUT_S:g} s")
        time.sleep(0.05)


def _starts(path: str, ident: dict[str, Any] | None = None) -> int:
    """Start events in the journal: of the trial ``ident`` (budget_flops, r, s), or of any trial."""
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return sum(1 for line in f if _is_start(line, ident or {}))


def _is_start(line: str, ident: dict[str, Any]) -> bool:
    try:
        entry = json.loads(line)
    except json.JSONDecodeError:  # a line cut short by a kill
        return False
    return entry.get("event") == "start" and all(entry.get(k) == v for k, v in ident.items())
