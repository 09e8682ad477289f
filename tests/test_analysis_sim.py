"""Simulated sweeps for the analysis tests: the paper's 116-run grid through ``objectives.simulate``, as a runs
table or logged to a real MLflow sqlite store by the search's own trial logger (one run per trial, tags, params,
metrics, cell keys as the search writes them). Other analysis test modules import the builders from here; the tests below pin the grid itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from loopscale.model import PAPER_LAW, JointLaw
from loopscale.objectives import TrialConfig, simulate

# docs/paper.md, "The grid": budget -> widths s, for each r in {1, 2, 4, 8}.
PAPER_GRID = {4.64e17: (6, 8, 10, 12), 1e18: (6, 8, 10, 12, 14), 2.15e18: (8, 10, 12, 14, 16),
              4.64e18: (10, 12, 14, 16, 18, 20), 1e19: (12, 16, 18, 20, 24), 2.15e19: (18, 24, 28, 34)}
RECURRENCES = (1, 2, 4, 8)
TEMPLATE = dict(depth=20, prelude=2, coda=2, width_unit=64, head_dim=128, seq_len=2048, vocab_size=32064,
                injection="linear")
BATCH = 262_144


def trial_configs(law: JointLaw = PAPER_LAW, noise: float = 0.0, seed: int = 0,
                  grid: dict[float, tuple[int, ...]] = PAPER_GRID,
                  recurrences: tuple[int, ...] = RECURRENCES) -> list[TrialConfig]:
    return [TrialConfig(budget_flops=c, r=r, s=float(s), template=dict(TEMPLATE), batch_tokens=BATCH, seed=seed,
                        objective="simulate", law=law.to_dict(), noise=noise,
                        cell_noise=0.0, misspec=0.0)  # independent noise only: these tests know its size exactly
            for c, widths in grid.items() for r in recurrences for s in widths]


def paper_runs(law: JointLaw = PAPER_LAW, noise: float = 0.0, seed: int = 0, **grid: Any) -> pd.DataFrame:
    """The runs table of a simulated sweep, as ``analysis.load_runs`` would return it (its columns)."""
    rows = []
    for i, config in enumerate(trial_configs(law, noise, seed, **grid)):
        metrics = simulate(config)
        rows.append({"run_id": f"sim{i}", "sweep": "sim", "stage": "search", "seed": seed,
                     "objective": "simulate", **{k: v for k, v in metrics.items() if k != "reason"},
                     "reason": ""})
    return pd.DataFrame(rows)


def log_sweep(tracking_uri: str, experiment: str, configs: list[TrialConfig], artifact_dir: Path, *,
              extra: list[tuple[TrialConfig, dict[str, str]]] = ()) -> str:
    """Log trials to MLflow with the search's own writer (``search.tracking.TrialTracker``, as the driver of a
    sweep does, without Ray): a parent run, then one run per trial with the search's tags (cell keys included),
    params and metrics.

    ``extra``: (trial config, {"status": "failed" | "diverged", "reason": ...}) of trials that did not finish ok;
    a failed one is logged as the driver logs a trial that raised, a diverged one as a trial reporting it.
    Returns the experiment id.
    """
    import mlflow
    from mlflow.tracking import MlflowClient

    from loopscale.analysis.store import KIND_TAG
    from loopscale.search.space import cell_key
    from loopscale.search.tracking import TrialTracker

    client = MlflowClient(tracking_uri)
    exp_id = client.create_experiment(experiment, artifact_location=artifact_dir.as_uri())
    parent = client.create_run(exp_id, tags={KIND_TAG: "sweep", "sweep": experiment}).info.run_id
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(tracking_uri)  # the tracker resolves its store as in a sweep (open_sweep sets it)
    try:
        tracker = TrialTracker(experiment_id=exp_id, parent_run_id=parent, sweep=experiment, tags={}, flush_s=1e9)
        tracker.open()
        counts: dict[str, int] = {}
        for config, outcome in [(c, {}) for c in configs] + list(extra):
            cell = cell_key(config.budget_flops, config.r)
            counts[cell] = counts.get(cell, 0) + 1
            key = f"search/{cell}/{counts[cell]}"
            tracker.start(key, {"stage": "search", "cell": cell}, config)
            if not outcome:
                tracker.finish(key, simulate(config))
            elif outcome["status"] == "failed":
                tracker.fail(key, outcome["reason"])
            else:
                tracker.finish(key, outcome)
        tracker.close()
    finally:
        mlflow.set_tracking_uri(before)
    client.set_terminated(parent, "FINISHED")
    return exp_id


def test_paper_grid_has_116_runs_29_per_r():
    runs = paper_runs()
    assert len(runs) == 116
    assert runs.groupby("r").size().to_dict() == {1: 29, 2: 29, 4: 29, 8: 29}


def test_simulated_runs_follow_the_law_exactly_without_noise():
    runs = paper_runs()
    clean = PAPER_LAW.loss(runs["N_once"], runs["N_rec"], runs["r"], runs["tokens"])
    assert (runs["val_loss"] - clean).abs().max() < 1e-12
