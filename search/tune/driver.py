"""The driver of a sweep (``run_search``): check that it may start, take the sweep's lock and signals, prepare
the data, start or join Ray, open the sweep's MLflow run, run the calibration stage (if any), the search
stage (``stage.run_stage``) and the validation rungs (if any: search/validate.py), and close the sweep with the
FLOPs it spent. ``loopscale validate`` runs the rungs of a finished sweep through the same driver."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from loopscale import objectives
from loopscale.analysis.calibration import RateChoice, choose_rate, reference_rate
from loopscale.analysis.flops import flops_text, paper_grid_reference
from loopscale.analysis.store import redact
from loopscale.analysis.validation import STAGE
from loopscale.analysis.validation import lines as validation_lines

from ..preflight import check_free_space, check_ray_address, ray_address
from ..rate_sensitivity import rate_param, rate_stage
from ..spec import SweepSpec
from ..stopping import StoreFailure, SweepInterrupted, raise_if_interrupted
from ..sweep_lock import SweepLock
from ..validate import RungPlan, finish, plan_rungs, rungs_trained
from ..tracking import close_sweep, code_version, find_parent_run, open_sweep, record_calibration, store_errors
from . import live
from .cluster import check_trials_fit, quiet, start_ray
from .receipts import JsonFile
from .stage import SNAPSHOT_ENV, StageOutcome, SweepContext, resume_command, run_stage
from .metric import METRIC, finite

STATE_FILE = "sweep.json"


@dataclass
class SweepOutcome:
    spec: SweepSpec
    stages: dict[str, StageOutcome]
    already_complete: bool = False
    experiment_id: str = ""
    parent_run_id: str = ""


class SweepState(JsonFile):
    """``<storage>/<name>/sweep.json``: the spec hash, whether the sweep completed, and what its stages do where
    the hash does not say (``spec_parts.hashed_as_written``): ``rounds``, whether its searchers propose in rounds, and
    ``calibration``, how its calibration chooses the rate ("fit": ``analysis.calibration.choose_rate``). A sweep
    started before they were recorded does as it did then: in rounds only where its spec wrote ``rounds = true``,
    and with the calibration trial of the lowest loss ("best")."""

    def __init__(self, storage: str, name: str):
        super().__init__(f"{storage.rstrip('/')}/{name}/{STATE_FILE}")

    def remove(self) -> None:
        self._fs.delete_file(self._file)

    @staticmethod
    def fresh(spec: SweepSpec) -> dict[str, Any]:
        return {"spec_hash": spec.spec_hash, "complete": False, "rounds": spec.sampling.rounds,
                "calibration": "fit"}

    @staticmethod
    def rounds(saved: dict[str, Any], spec: SweepSpec) -> bool:
        return saved.get("rounds", spec.sampling.rounds_written is True)

    @staticmethod
    def calibration(saved: dict[str, Any]) -> str:
        return saved.get("calibration", "best")


def run_search(spec: SweepSpec, *, resume: bool = False, verbose: bool = False, rungs: RungPlan | None = None,
               resume_with: str = "") -> SweepOutcome:
    """Run (or resume) the sweep: calibration if the spec asks for it, then the allocation search, then its
    ``[validate]`` rungs. With ``rungs`` (``loopscale validate``, which resumes with ``resume_with``), the sweep
    must be complete, and only those rungs run.

    The sweep is complete only when every planned trial has its ended run in MLflow. Raises ValueError
    (before Ray starts, writing nothing) when the sweep cannot start: the stored state does not match (state
    but no ``resume``, a changed spec, an MLflow store that already holds this sweep), another driver runs it,
    the Ray address does not answer, a disk has no room. After a clean stop it raises ``SweepInterrupted``
    (a signal) or ``StoreFailure`` (the MLflow store or a disk failed); everything finished is kept for
    ``--resume``.
    """
    raise_if_interrupted()  # a signal that the imports of this module swallowed (stopping.interrupt)
    check_ray_address(ray_address(spec.placement.address))
    live.STOP.reset()
    live.SEARCHERS.clear()
    local = "://" not in spec.placement.storage
    lock = SweepLock(Path(spec.placement.storage) / spec.name) if local else contextlib.nullcontext()
    with lock, live.STOP.handling_signals():
        try:
            return _drive(spec, resume, verbose, rungs, resume_with)
        except SweepInterrupted as exc:  # before a stage ran: resumable once the sweep's state is written
            if "--resume" in str(exc) or SweepState(spec.placement.storage, spec.name).load() is None:
                raise
            raise type(exc)(exc.signum, f"{exc}; resume with: {resume_command(spec)}") from None


def _drive(spec: SweepSpec, resume: bool, verbose: bool, rungs: RungPlan | None, resume_with: str) -> SweepOutcome:
    state = SweepState(spec.placement.storage, spec.name)
    saved = state.load()
    if rungs is not None:  # the rungs of a complete sweep: its stages are done, the rungs run below
        if not (saved or {}).get("complete"):
            raise ValueError(f"sweep {spec.name!r} is not complete ({state.path}); finish it first: "
                             f"{resume_command(spec)}")
    elif saved is not None:
        if saved["spec_hash"] != spec.spec_hash:
            raise ValueError(f"sweep {spec.name!r} at {state.path} was started from a different spec "
                             f"(hash {saved['spec_hash']} != {spec.spec_hash}); use a new name or remove that state")
        if saved.get("complete") and find_parent_run(spec.placement.tracking_uri, spec.name) is not None:
            if not spec.rungs.budgets or rungs_trained(spec):
                print(f"sweep {spec.name!r} is already complete ({state.path}); nothing to do", flush=True)
                return SweepOutcome(spec, {}, already_complete=True)
            rungs = plan_rungs(spec, list(spec.rungs.budgets))  # [validate] added to a finished sweep
        elif saved.get("complete"):
            lost = (f"sweep {spec.name!r} is complete ({state.path}) but MLflow "
                    f"{redact(spec.placement.tracking_uri)} holds none of its runs")
            if not resume:
                raise ValueError(f"{lost}; pass --resume to log them there again from the trials' receipts")
            # the stages restore with every trial finished and log each from its receipt; until that is done
            # (and should it be interrupted) the sweep is not complete in this store
            print(f"{lost}: logging them there again from the trials' receipts", flush=True)
            saved = {**saved, "complete": False}
        elif not resume:
            raise ValueError(f"sweep {spec.name!r} has unfinished state at {state.path}: pass --resume to "
                             f"continue it (or remove that directory to start over)")
    elif find_parent_run(spec.placement.tracking_uri, spec.name) is not None:
        raise ValueError(f"MLflow experiment {spec.name!r} already holds a sweep of that name but there is no "
                         f"Tune state for it at {state.path}; use a new name or delete the experiment")
    disks = _disks(spec)
    check_free_space(disks, spec.planned_trials())
    quiet(verbose)
    user_period = os.environ.get(SNAPSHOT_ENV)
    fingerprint = _prepare_data(spec)
    started_ray = start_ray(spec, verbose)
    try:
        check_trials_fit(spec,
                         can_grow=not started_ray or bool(spec.placement.address or os.environ.get("RAY_ADDRESS")))
        fresh = saved is None
        saved = saved or SweepState.fresh(spec)
        state.save(saved)  # first: a crash from here on is resumable
        try:
            with store_errors(spec.placement.tracking_uri):
                experiment_id, parent = open_sweep(spec, fingerprint)
        except StoreFailure:
            if fresh:  # nothing ran: leave no state that would then demand --resume
                state.remove()
            raise
        print(f"sweep {spec.name!r}: {len(spec.cells())} cells, {spec.planned_trials()} trials, objective "
              f"{spec.objective}; MLflow {redact(spec.placement.tracking_uri)} (experiment {spec.name!r}); "
              f"Tune state {Path(state.path).parent}", flush=True)
        tags = {"spec_hash": spec.spec_hash, "code_version": code_version(), "data_fingerprint": fingerprint}
        stages: dict[str, StageOutcome] = {}
        recipe = spec.training.recipe
        sweep = SweepContext(spec, experiment_id, parent, tags, verbose, user_period, disks, resume_with,
                             rounds=SweepState.rounds(saved, spec))
        if rungs is not None:
            stages[STAGE] = _run_rungs(sweep, rungs)
            with store_errors(spec.placement.tracking_uri):
                close_sweep(spec.placement.tracking_uri, parent)
            return SweepOutcome(spec, stages, experiment_id=experiment_id, parent_run_id=parent)
        if spec.training.calibrate is not None:
            stages["calibrate"] = run_stage(sweep, "calibrate", spec.training.recipe)
            best = stages["calibrate"].best()
            if best is None:
                raise RuntimeError(f"calibration: no trial trained without diverging; change [calibrate] low/high "
                                   f"and start over (remove {Path(state.path).parent})")
            param = spec.training.calibrate.param
            if SweepState.calibration(saved) == "fit":
                choice = calibration_choice(spec, stages["calibrate"])
                rate, line = choice.rate, choice.line()
                with store_errors(spec.placement.tracking_uri):
                    record_calibration(spec.placement.tracking_uri, parent, choice.to_dict())
            else:  # a sweep started before the fit: its search trials trained at its best trial's rate
                rate = best["trial"]["recipe"][param]
                line = f"calibrated {param} = {rate:.4g} (val_loss {best[METRIC]:.4f}); every search trial uses it"
            recipe = {**spec.training.recipe, param: rate}
            print(line, flush=True)
        stages["search"] = run_stage(sweep, "search", recipe)
        for name, factor in spec.sensitivity.stages():
            cells, bases = rate_stage(spec, stages["search"].results, name, factor)
            print(f"rate sensitivity: each cell's best width at {rate_param(spec)} x {factor:g}", flush=True)
            stages[name] = run_stage(sweep, name, None, cells, bases)
        if spec.rungs.budgets:
            print(f"rungs at {', '.join(f'{c:.3g}' for c in spec.rungs.budgets)} FLOPs: fitting the sweep's law",
                  flush=True)
            stages[STAGE] = _run_rungs(sweep, plan_rungs(spec, list(spec.rungs.budgets), recipe=recipe))
        flops = flops_spent(spec, {k: v for k, v in stages.items() if k != STAGE})  # the rungs': printed apart
        with store_errors(spec.placement.tracking_uri):
            close_sweep(spec.placement.tracking_uri, parent, flops)
        state.save({**saved, "complete": True})
        print(f"spent: {flops_text(flops['total'], flops['paper_grid'])}", flush=True)
        print(f"sweep {spec.name!r} complete; fit it with: loopscale analyze --experiment {spec.name} "
              f"--tracking-uri {redact(spec.placement.tracking_uri)}", flush=True)
        return SweepOutcome(spec, stages, experiment_id=experiment_id, parent_run_id=parent)
    finally:
        if user_period is None:
            os.environ.pop(SNAPSHOT_ENV, None)
        else:
            os.environ[SNAPSHOT_ENV] = user_period
        if started_ray:
            ray.shutdown()


def calibration_choice(spec: SweepSpec, outcome: StageOutcome) -> RateChoice:
    """The rate the calibration stage's trials choose (``analysis.calibration.choose_rate``)."""
    cal = spec.training.calibrate
    ok = [r.get("status") == "ok" and finite(r.get(METRIC)) for r in outcome.results]
    return choose_rate(cal.param, [r["trial"]["recipe"][cal.param] for r in outcome.results],
                       [r[METRIC] if good else None for r, good in zip(outcome.results, ok)],
                       reference_rate((spec.training.recipe or {}).get(cal.param), cal.low, cal.high))


def _run_rungs(sweep: SweepContext, plan: RungPlan) -> StageOutcome:
    """The validation stage of ``plan``'s rungs (planned once, kept before it starts), then the comparison,
    printed and written to the rungs' MLflow runs."""
    if not plan.complete:
        plan.save(sweep.spec)
    print(f"validation: {len(plan.rungs)} rungs, the law's compute-optimal model at each", flush=True)
    outcome = run_stage(sweep, STAGE, plan.recipe, plan.cells())
    with store_errors(sweep.spec.placement.tracking_uri):
        table = finish(sweep.spec, plan)
    spent = sum(float(r["flops_spent"]) for r in outcome.results if finite(r.get("flops_spent")))
    print("\n".join(validation_lines(table)) + f"\nthe rungs spent {flops_text(spent, None)}", flush=True)
    return outcome


def _disks(spec: SweepSpec) -> dict[str, str]:
    """The local folders a sweep writes to, by what they hold (the free-space checks)."""
    disks = {"Tune storage": spec.placement.storage}
    if spec.placement.tracking_uri.startswith("sqlite:///"):
        disks["MLflow store"] = str(Path(spec.placement.tracking_uri.removeprefix("sqlite:///")).parent)
    return disks


def flops_spent(spec: SweepSpec, stages: dict[str, StageOutcome]) -> dict[str, Any]:
    """FLOPs the sweep's trials spent: total (every stage), per search cell, and the paper grid's figure where
    the sweep covers its cells with its template and batch (else None)."""
    spent = [(r["cell"], r["stage"], float(r.get("flops_spent", 0.0))) for s in stages.values() for r in s.results
             if finite(r.get("flops_spent"))]
    per_cell = {c.key: sum(f for cell, stage, f in spent if cell == c.key and stage == "search") for c in spec.cells()}
    reference = paper_grid_reference(spec.grid.budgets, spec.grid.recurrences, spec.grid.model_template(),
                                     spec.grid.batch_tokens)
    return {"total": sum(f for _, _, f in spent), "per_cell": per_cell, "paper_grid": reference}


def _prepare_data(spec: SweepSpec) -> str:
    """Tokenise and cache the data once on the driver (trials only read the cache); its fingerprint."""
    if spec.objective == "simulate" and spec.training.calibrate is None:
        return "simulated"
    return objectives.prepare_data(spec.training.data, spec.grid.seq_len, spec.placement.cache_dir,
                                   spec.training.val_tokens)

