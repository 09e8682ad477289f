"""The validation rungs of a sweep (``loopscale validate``, or ``[validate] budgets`` at the end of a sweep): from
the sweep's fitted law, the buildable compute-optimal model at each rung budget and r (analysis/validation.py,
through the allocation ``loopscale export`` prints), trained as the one trial of its cell in a Tune stage named
``validate`` (search/tune/stage.py: checkpoints, receipts, resume and status as for any trial), logged to the
sweep's MLflow experiment with ``stage`` = ``validate``, then compared with the law's prediction.

The rungs are planned once: the plan (each rung's model, its prediction and the recipe it trains with) is kept in
``<storage>/<sweep>/validate.json`` before the stage starts, so a resumed or repeated validation trains the very
rungs it planned, whatever a later fit would say. No Ray here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from loopscale.analysis import validation
from loopscale.analysis.options import DEFAULT_FIT_OPTIONS
from loopscale.analysis.store import numbers_tags, runs_query

from .space import Cell
from .spec import SweepSpec
from .spec_parts import Rungs
from .tune.receipts import JsonFile

PLAN_FILE = "validate.json"
PREDICTED = ("predicted", "predicted_lo", "predicted_hi", "gap_predicted", "gap_lo", "gap_hi")


def plan_file(spec: SweepSpec) -> JsonFile:
    return JsonFile(f"{spec.placement.storage.rstrip('/')}/{spec.name}/{PLAN_FILE}")


@dataclass(frozen=True)
class RungPlan:
    """The rungs (one row each: budget_flops, r, width, heads, s, N_once, N_rec, tokens, steps and the
    ``PREDICTED`` columns), the recipe they train with, and the largest budget the law was fitted on."""

    rungs: pd.DataFrame
    recipe: dict[str, Any] | None
    fitted_top: float
    complete: bool = False

    def request(self) -> tuple[list[float], list[int]]:
        return sorted(set(self.rungs["budget_flops"])), sorted(set(int(r) for r in self.rungs["r"]))

    def cells(self) -> list[Cell]:
        """One cell per rung, of one trial at the rung's width."""
        return [Cell(validation.STAGE, float(row.budget_flops), int(row.r), (float(row.s),), float(row.s), 1)
                for row in self.rungs.itertuples(index=False)]

    def save(self, spec: SweepSpec, complete: bool = False) -> None:
        plan_file(spec).save({"rungs": self.rungs.to_dict(orient="records"), "recipe": self.recipe,
                              "fitted_top": self.fitted_top, "complete": complete})

    @classmethod
    def load(cls, spec: SweepSpec) -> "RungPlan | None":
        saved = plan_file(spec).load()
        if saved is None:
            return None
        return cls(pd.DataFrame(saved["rungs"]).astype({c: float for c in PREDICTED}), saved["recipe"],
                   saved["fitted_top"], saved["complete"])


def ran_spec(name: str, tracking_uri: str) -> SweepSpec:
    """The spec sweep ``name`` ran with, read back from its store (its ``spec.toml``) with its paths where its
    driver resolved them (``tracking.folder_tags``), whichever folder this runs in; one ValueError line when the
    store holds no such sweep. A sweep logged before those tags were written resolves them against this folder."""
    from loopscale.analysis.tracking import read_sweep_spec

    from .tracking import find_parent_run, spec_folders

    parent = find_parent_run(tracking_uri, name)
    raw = read_sweep_spec(name, tracking_uri) if parent is not None else None
    if raw is None:
        raise ValueError(f"no sweep {name!r} with its spec in the MLflow store {tracking_uri}; "
                         "run `loopscale search` first (or pass --tracking-uri)")
    placed, folder = spec_folders(parent)
    return SweepSpec.from_dict({**raw, **placed, "tracking_uri": tracking_uri}, source=name, folder=folder)


def rungs_trained(spec: SweepSpec) -> bool:
    """Whether the rungs the spec's ``[validate]`` asks for were trained."""
    plan = RungPlan.load(spec)
    return plan is not None and plan.complete and plan.request() == (sorted(spec.rungs.budgets),
                                                                     sorted(spec.grid.recurrences))


def check_request(budgets: list[float], recurrences: list[int] | None) -> None:
    """One line for rungs asked for that no sweep could plan: a budget or r named twice (a rung is one trial), a
    budget that is no FLOP count; ``loopscale validate`` asks this before it reads the sweep."""
    for flag, values in (("--budget", budgets), ("--r", recurrences or [])):
        twice = sorted(v for v in set(values) if values.count(v) > 1)
        if twice:
            raise ValueError(f"{flag} lists {twice[0]:g} twice; each rung is one trial, so name each once")
    Rungs.finite(budgets, "--budget")


def plan_rungs(spec: SweepSpec, budgets: list[float], recurrences: list[int] | None = None,
               recipe: dict[str, Any] | None = None) -> RungPlan:
    """The rungs at ``budgets`` x ``recurrences`` (default: the sweep's r's) under the law fitted to the sweep's
    runs in MLflow (analyze's default fit); the saved plan where the same rungs were planned before. ``recipe``:
    the recipe the search trained with (default: read back, ``search_recipe``). One-line ValueError for rungs
    that cannot be planned: those of ``check_request``, a budget not above the sweep's, a model that cannot be
    built, other rungs planned before."""
    from loopscale.analysis.fit import fit_joint_law
    from loopscale.analysis.runs import load_runs, usable_runs

    check_request(budgets, recurrences)
    recurrences = sorted(recurrences or spec.grid.recurrences)
    unknown = [r for r in recurrences if r not in spec.grid.recurrences]
    if unknown:
        raise ValueError(f"--r {unknown[0]} is not a recurrence of sweep {spec.name!r} "
                         f"({', '.join(map(str, spec.grid.recurrences))}): its law measured no phi for it to check")
    Rungs.check(spec.grid, budgets, "--budget")  # a budget not above the sweep, or too small: before anything
    saved = RungPlan.load(spec)
    if saved is not None:
        if saved.request() == (sorted(budgets), recurrences):
            return saved
        planned, rs = saved.request()
        raise ValueError(f"sweep {spec.name!r} already has its rungs (budgets "
                         f"{', '.join(f'{b:.3g}' for b in planned)}; r {', '.join(map(str, rs))}) in "
                         f"{plan_file(spec).path}; ask for those, or remove that file and the folder "
                         f"{plan_file(spec).path.rsplit('/', 1)[0]}/{validation.STAGE} to plan others")
    options = DEFAULT_FIT_OPTIONS
    runs = load_runs(spec.name, spec.placement.tracking_uri)
    fitted = usable_runs(runs, stage=options.stage)["budget_flops"]
    if fitted.empty:
        raise ValueError(f"sweep {spec.name!r} has no usable search runs to fit a law to")
    fit = fit_joint_law(runs, options=options)
    table = validation.rung_table(fit, budgets, recurrences, template=spec.grid.model_template(),
                                  batch_tokens=spec.grid.batch_tokens, min_steps=spec.grid.min_steps)
    table = validation.predictions(fit, table, validation.noise_residuals(fit, runs, options))
    recipe = search_recipe(spec) if recipe is None else recipe
    if recipe and recipe.get("branch_budgets"):  # a rung's loss is its own run's end: branches would cost FLOPs only
        recipe = {**recipe, "branch_budgets": []}
    return RungPlan(table, recipe, float(fitted.max()))


def search_recipe(spec: SweepSpec) -> dict[str, Any] | None:
    """The recipe the sweep's search trials trained with: the spec's, with the calibrated rate where the sweep
    calibrated one (as its search trials recorded it: the driver's choice, by whichever rule the sweep began
    with, search/tune/driver.py)."""
    recipe, calibrate = spec.training.recipe, spec.training.calibrate
    if calibrate is None or spec.objective == "simulate":
        return recipe
    from mlflow.tracking import MlflowClient

    client = MlflowClient(spec.placement.tracking_uri)
    experiment = client.get_experiment_by_name(spec.name)
    runs = client.search_runs([experiment.experiment_id], runs_query("trial", stage="search"), max_results=1)
    if not runs:
        raise ValueError(f"sweep {spec.name!r} calibrated no learning rate (no search trial ran)")
    return {**recipe, calibrate.param: float(runs[0].data.params[f"recipe.{calibrate.param}"])}


def achieved_table(spec: SweepSpec, plan: RungPlan) -> pd.DataFrame:
    """The rungs predicted (``plan``) and achieved (their runs in MLflow that ended ok): ``validation.verdicts``."""
    from loopscale.analysis.runs import load_runs

    runs = load_runs(spec.name, spec.placement.tracking_uri)
    rungs = runs[(runs["stage"] == validation.STAGE) & (runs["status"] == "ok")]
    return validation.verdicts(plan.rungs, rungs, plan.fitted_top)


def finish(spec: SweepSpec, plan: RungPlan) -> pd.DataFrame:
    """After the stage: the rungs predicted and achieved (``achieved_table``), written as columns of each
    rung's MLflow run (numbers predicted, predicted_lo, predicted_hi, gap_predicted, gap_lo, gap_hi in its
    ``store.NUMBERS_TAG``; tag ``validation`` hit or miss), and the plan marked complete."""
    from mlflow.entities import RunTag
    from mlflow.tracking import MlflowClient

    table = achieved_table(spec, plan)
    client = MlflowClient(spec.placement.tracking_uri)
    experiment = client.get_experiment_by_name(spec.name)
    for run in client.search_runs([experiment.experiment_id], runs_query("trial", stage=validation.STAGE)):
        budget, r = float(run.data.tags["budget"]), int(run.data.tags["r"])
        row = table[np.isclose(table["budget_flops"], budget, rtol=1e-5) & (table["r"] == r)]
        if row.empty:
            continue
        row = row.iloc[0]
        predicted = {column: float(row[column]) for column in PREDICTED if np.isfinite(row[column])}
        tags = {**numbers_tags(predicted, run), "validation": row["verdict"]}
        client.log_batch(run.info.run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    plan.save(spec, complete=True)
    return table
