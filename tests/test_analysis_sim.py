"""Simulated sweeps for the analysis tests: the paper's 116-run grid through ``objectives.simulate``, as a runs
table or logged to a real MLflow sqlite store with the search's layout (one run per trial, tags, params,
metrics). Other analysis test modules import the builders from here; the tests below pin the grid itself.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pandas as pd

from loopscale.model import PAPER_LAW, JointLaw
from loopscale.objectives import simulate

# PAPER.md, "The grid": budget -> widths s, for each r in {1, 2, 4, 8}.
PAPER_GRID = {4.64e17: (6, 8, 10, 12), 1e18: (6, 8, 10, 12, 14), 2.15e18: (8, 10, 12, 14, 16),
              4.64e18: (10, 12, 14, 16, 18, 20), 1e19: (12, 16, 18, 20, 24), 2.15e19: (18, 24, 28, 34)}
RECURRENCES = (1, 2, 4, 8)
TEMPLATE = dict(depth=20, prelude=2, coda=2, width_unit=64, head_dim=128, seq_len=2048, vocab_size=32064,
                injection="linear")
BATCH = 262_144


def trial_configs(law: JointLaw = PAPER_LAW, noise: float = 0.0, seed: int = 0,
                  grid: dict[float, tuple[int, ...]] = PAPER_GRID,
                  recurrences: tuple[int, ...] = RECURRENCES) -> list[dict[str, Any]]:
    return [{"budget_flops": c, "r": r, "s": float(s), "template": dict(TEMPLATE), "batch_tokens": BATCH,
             "seed": seed, "objective": "simulate", "law": law.to_dict(), "noise": noise,
             "cell_noise": 0.0, "misspec": 0.0}  # independent noise only: these tests know its size exactly
            for c, widths in grid.items() for r in recurrences for s in widths]


def paper_runs(law: JointLaw = PAPER_LAW, noise: float = 0.0, seed: int = 0, **grid: Any) -> pd.DataFrame:
    """The runs table (DESIGN.md columns) of a simulated sweep, as ``analysis.load_runs`` would return it."""
    rows = []
    for i, config in enumerate(trial_configs(law, noise, seed, **grid)):
        metrics = simulate(config)
        rows.append({"run_id": f"sim{i}", "sweep": "sim", "stage": "search", "seed": seed,
                     "objective": "simulate", **{k: v for k, v in metrics.items() if k != "reason"},
                     "reason": ""})
    return pd.DataFrame(rows)


def log_sweep(tracking_uri: str, experiment: str, configs: list[dict[str, Any]], artifact_dir: Path, *,
              extra: list[tuple[dict[str, Any], dict[str, str]]] = ()) -> str:
    """Log trials to MLflow the way the search does: one run per trial, kind/sweep/stage/cell/r/budget/status
    tags, the trial config flattened as params, the returned numbers as metrics.

    ``extra``: (trial config, tags) of trials that did not finish ok; they get those tags and no metrics.
    Returns the experiment id.
    """
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    exp_id = client.create_experiment(experiment, artifact_location=artifact_dir.as_uri())
    now = int(time.time() * 1000)
    for config, tags in [(c, {}) for c in configs] + list(extra):
        cell = f"C{config['budget_flops']:.3g}-r{config['r']}"
        base = {"loopscale.kind": "trial", "sweep": experiment, "stage": "search", "cell": cell,
                "r": str(config["r"]), "budget": f"{config['budget_flops']:.6g}", "objective": "simulate"}
        run = client.create_run(exp_id, tags={**base, **tags})
        metrics = []
        if not tags:
            result = simulate(config)
            metrics = [Metric(k, float(v), now, 0) for k, v in result.items()
                       if isinstance(v, (int, float)) and math.isfinite(v)]
            tags = {"status": result["status"], "reason": result.get("reason", "")}
        params = [Param(k, str(v)) for k, v in _flat(config).items()]
        client.log_batch(run.info.run_id, metrics=metrics, params=params,
                         tags=[RunTag(k, v) for k, v in tags.items()])
        client.set_terminated(run.info.run_id, "FAILED" if tags["status"] == "failed" else "FINISHED")
    return exp_id


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_paper_grid_has_116_runs_29_per_r():
    runs = paper_runs()
    assert len(runs) == 116
    assert runs.groupby("r").size().to_dict() == {1: 29, 2: 29, 4: 29, 8: 29}


def test_simulated_runs_follow_the_law_exactly_without_noise():
    runs = paper_runs()
    clean = PAPER_LAW.loss(runs["N_once"], runs["N_rec"], runs["r"], runs["tokens"])
    assert (runs["val_loss"] - clean).abs().max() < 1e-12
