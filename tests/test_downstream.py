"""Downstream scores in the analysis and through the CLI: the matched-loss test holds its size on simulated sweeps
where r has no effect beyond its loss and finds a planted one; the gap at matched compute equals its hand
computation; a real tiny sweep's kept models scored on the built-in probes and on a bundle through ``loopscale
evaluate --tasks``, their numbers on the runs, and ``analyze``'s tables, summary and verdicts from them."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from loopscale.analysis.downstream.accuracy import axis_score, wilson
from loopscale.analysis.downstream.compute import gap_at_compute
from loopscale.analysis.downstream.matched_loss import fit_loss_curve
from test_spec import write_spec
from test_tasks import write_bundle

CHANCE = 0.25


def simulated_axis(rng, planted: float = 0.0, model_noise: float = 0.0, tasks: int = 3, items: int = 200):
    """3 budgets x r in {1, 2, 4}, one kept model each: its loss from the budget and r, its accuracy on a sigmoid
    in that loss (plus ``planted`` at r = 4 and a model's own offset of sd ``model_noise``), scored on ``tasks``
    tasks of ``items`` binomial items."""
    rows = []
    for budget, base in ((1e12, 2.3), (2e12, 2.0), (4e12, 1.7)):
        for r in (1, 2, 4):
            loss = base + 0.04 * math.log2(r) + rng.normal(0, 0.03)
            p = CHANCE + (1 - CHANCE) / (1 + math.exp(4 * (loss - 2.0))) + (planted if r == 4 else 0.0)
            p = min(max(p + rng.normal(0, model_noise), 0.0), 1.0) if model_noise else p
            score, se = axis_score(list(rng.binomial(items, p, size=tasks)), [items] * tasks)
            rows.append({"r": r, "budget_flops": budget, "loss": loss, "score": score, "se": se, "chance": CHANCE})
    return pd.DataFrame(rows)


def false_verdicts(seed: int, reps: int, **kwargs) -> float:
    rng = np.random.default_rng(seed)
    verdicts = [s.verdict for _ in range(reps) for s in fit_loss_curve(simulated_axis(rng, **kwargs)).shifts.values()]
    return sum(v != "cannot tell from none" for v in verdicts) / len(verdicts)


def test_the_matched_loss_test_holds_its_size_where_r_buys_nothing_beyond_its_loss():
    # 2 shifts (r = 2, 4) x 200 sweeps: a rate of 5% has a binomial sd of 1.1 points
    assert 0.02 <= false_verdicts(0, 200) <= 0.085
    assert 0.02 <= false_verdicts(1, 200, model_noise=0.03) <= 0.085  # models that differ beyond their items


def test_the_matched_loss_test_finds_a_planted_shift():
    rng = np.random.default_rng(2)
    found = [fit_loss_curve(simulated_axis(rng, planted=0.08)).shifts[4] for _ in range(100)]
    assert sum(s.verdict == "more than its loss predicts" for s in found) >= 90
    assert np.median([s.shift for s in found]) == pytest.approx(0.08, abs=0.015)
    assert all(s.ci[0] < s.shift < s.ci[1] for s in found)


def test_too_few_models_give_no_test():
    rng = np.random.default_rng(3)
    assert fit_loss_curve(simulated_axis(rng).iloc[:4]) is None  # 4 models, 4 parameters


def test_the_gap_at_matched_compute_is_the_mean_difference_over_shared_budgets():
    table = pd.DataFrame({"r": [1, 1, 4, 4, 4], "budget_flops": [1, 2, 1, 2, 3], "score": [0.5, 0.6, 0.4, 0.7, 0.9],
                          "se": [0.03, 0.04, 0.03, 0.05, 0.1]})
    gap = gap_at_compute(table)[4]
    half = 1.959964 * math.sqrt(0.03 ** 2 + 0.04 ** 2 + 0.03 ** 2 + 0.05 ** 2) / 2
    assert gap["gap"] == pytest.approx(0.0) and gap["budgets"] == 2  # (-0.1 + 0.1) / 2; budget 3 has no r = 1
    assert gap["ci"] == pytest.approx([-half, half], rel=1e-5)


def test_accuracy_intervals():
    assert wilson(0, 10)[0] == 0.0 and 0.2 < wilson(0, 10)[1] < 0.35  # 0 of 10 is not certainty
    score, se = axis_score([50, 100], [100, 200])
    # p shrunk to 51/102 and 101/202: both 1/2
    assert score == 0.5 and se == pytest.approx(math.sqrt(0.5 * 0.5 / 100 + 0.5 * 0.5 / 200) / 2)


def test_evaluate_scores_a_real_sweeps_kept_models_on_the_probes_and_a_bundle_and_analyze_reads_them(tmp_path,
                                                                                                       capsys):
    import ray
    from mlflow.tracking import MlflowClient

    from loopscale import load_runs
    from loopscale.analysis.downstream.report import downstream
    from loopscale.analysis.store import trial_numbers
    from loopscale.search import SweepSpec
    from loopscale.search.cli import main

    path = write_spec(tmp_path, objective="train", budgets=[4e9], recurrences=[1, 2], trials_per_cell=1,
                      sampler="grid", val_tokens=2048, data={"source": "kjv", "probe_share": 0.2},
                      recipe={"log_every": 2}, widths={"s_min": 2, "s_max": 2}, resources={"checkpoint_s": 0})
    spec = SweepSpec.from_toml(path)
    uri = spec.placement.tracking_uri
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        assert main(["search", str(path)]) == 0
    finally:
        ray.shutdown()
    capsys.readouterr()
    assert main(["evaluate", spec.name, "--tasks", "probes", "--r", "4", "--tracking-uri", uri, "--threads", "1"]) == 0
    out, err = capsys.readouterr()
    assert "axis scores (mean task accuracy, 95% interval over items):" in out and "variables_code_d1" in out
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name(spec.name).experiment_id],
                              "tags.`loopscale.kind` = 'trial'")
    for run in runs:
        numbers = trial_numbers(run)
        r = int(run.data.params["r"])
        evaluated = (r, 4) if "val_loss_r4" in numbers else (r,)  # where the r = 1 stack cannot loop, it says so
        assert len(evaluated) == 2 or (r == 1 and f"{run.info.run_name}: cannot evaluate at r=4" in err)
        for k in evaluated:
            assert 0 <= numbers[f"task.brackets_r{k}"] <= 1 and numbers["task.brackets_n"] == 200
            assert 0 <= numbers[f"axis.reasoning_primitives_r{k}"] <= 1
            assert 0 < numbers[f"axis.reasoning_primitives_r{k}_se"] < 0.1
        assert r == 1 or numbers["val_loss_r4"] > 0  # --r also measured the loss there
        assert numbers["axis.reasoning_primitives_chance"] == pytest.approx((4 * 0.2 + 0.125) / 5)

    bundle = write_bundle(tmp_path)
    assert main(["evaluate", spec.name, "--tasks", str(bundle), "--tracking-uri", uri]) == 0
    for run in runs:
        numbers, r = trial_numbers(client.get_run(run.info.run_id)), int(run.data.params["r"])
        assert {f"task.sky_r{r}", f"task.wino_r{r}", f"task.count_r{r}", "axis.language_chance"} <= set(numbers)
        assert f"axis.reasoning_primitives_r{r}" in numbers  # the earlier task set's numbers stay

    table = load_runs(spec.name, uri)
    result = downstream(table)
    assert set(result.scores["axis"]) >= {"parametric_knowledge", "reasoning_primitives", "language"}
    summary = result.summary()["reasoning_primitives"]
    assert summary["reference_r"] == 1 and set(summary["gap_at_compute"]) == {"2"}
    assert summary["gap_at_compute"]["2"]["ci"][0] < summary["gap_at_compute"]["2"]["gap"]
    assert summary["shift_at_loss"] == {} and summary["verdict"].startswith(
        "at equal loss on reasoning primitives: not tested (2 models with a loss")

    assert main(["evaluate", spec.name, "--tasks", "probes:x", "--tracking-uri", uri]) == 2
    assert "--tasks 'probes:x': the probes' seed must be a whole number" in capsys.readouterr().err
    assert main(["evaluate", spec.name, "--tasks", str(tmp_path / "none.yaml"), "--tracking-uri", uri]) == 2
    assert main(["evaluate", spec.name, "--tracking-uri", uri]) == 2
    assert "evaluate needs --r" in capsys.readouterr().err


def test_analyze_reports_the_gap_at_compute_and_the_shift_at_loss_per_axis(tmp_path, capsys):
    from loopscale.analysis.downstream.columns import axis_chance, axis_column, axis_se
    from loopscale.search.cli import main
    from test_analysis_sim import paper_runs

    rng = np.random.default_rng(5)
    runs = paper_runs(noise=0.01)
    kept = runs.groupby(["budget_flops", "r"])["val_loss"].idxmin()  # each cell's best, as keep_models keeps
    for axis, planted in (("parametric_knowledge", 0.0), ("reasoning_primitives", 0.15)):
        for index in kept:
            r, loss = int(runs.loc[index, "r"]), runs.loc[index, "val_loss"]
            p = CHANCE + (1 - CHANCE) / (1 + math.exp(6 * (loss - 2.6))) + (planted if r == 8 else 0.0)
            score, se = axis_score(list(rng.binomial(200, p, size=3)), [200] * 3)
            runs.loc[index, [axis_column(axis, r), axis_se(axis, r), axis_chance(axis)]] = score, se, CHANCE
    runs.to_csv(tmp_path / "sweep.csv", index=False)
    out = tmp_path / "out"
    assert main(["analyze", "--experiment", str(tmp_path / "sweep.csv"), "--out", str(out), "--n-starts", "20",
                 "--n-bootstrap", "10"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    summary = json.loads((out / "summary.json").read_text())["downstream"]
    reasoning, knowledge = summary["reasoning_primitives"], summary["parametric_knowledge"]
    assert reasoning["shift_at_loss"]["8"]["verdict"] == "more than its loss predicts"
    assert reasoning["shift_at_loss"]["8"]["ci"][0] < 0.15 < reasoning["shift_at_loss"]["8"]["ci"][1]
    assert [knowledge["shift_at_loss"][r]["verdict"] for r in ("2", "4", "8")] == ["cannot tell from none"] * 3
    assert knowledge["gap_at_compute"]["8"]["ci"][1] < 0  # r = 8's loss is higher at equal compute: so its score
    assert reasoning["verdict"] in text and reasoning["verdict"].startswith(
        "at equal loss on reasoning primitives, against r = 1: r = 2 is ")
    assert "at equal compute on parametric knowledge, against r = 1: r = 2 is " in text
    axes = pd.read_csv(out / "tables" / "downstream_axes.csv")
    assert len(axes) == 6 and (out / "plots" / "downstream.png").is_file()


def test_the_depth_at_evaluation_curve_recovers_a_saturating_decay_and_where_it_flattens():
    from loopscale.analysis.depth_curve import depth_curves

    rows = []
    for run_id, r, (l_inf, a, k) in (("a", 2, (1.8, 0.6, 0.5)), ("b", 4, (2.0, -0.3, 0.4))):
        for r_eval in (1, 2, 4, 6, 8, 12, 16):
            loss = l_inf + a * math.exp(-k * r_eval)
            rows.append({"run_id": run_id, "budget_flops": 1e12, "r": r, "r_eval": r_eval, "val_loss_r_eval": loss})
    curves = depth_curves(pd.DataFrame(rows)).set_index("run_id")
    assert curves.loc["a", ["L_inf", "A", "k"]].tolist() == pytest.approx([1.8, 0.6, 0.5], rel=1e-4)
    assert curves.loc["a", "points"] == 6 and curves.loc["a", "r_flat"] == pytest.approx(math.log(60) / 0.5, rel=1e-4)
    assert curves.loc["b", "A"] < 0 and math.isnan(curves.loc["b", "r_flat"])  # looping past training hurts
    assert depth_curves(pd.DataFrame(rows[:3])).empty  # too few r_eval at or above the trained r


def test_an_axis_every_model_scores_the_same_on_is_not_tested():
    from loopscale.analysis.downstream.report import downstream

    rng = np.random.default_rng(4)
    runs = simulated_axis(rng).rename(columns={"loss": "val_loss", "score": "axis.math_word_problems_r0"})
    runs = runs.assign(run_id=[f"m{i}" for i in range(len(runs))], stage="search", status="ok", width=16.0)
    for r in (1, 2, 4):  # the scores at each model's own r; all 0, as exact-match arithmetic gives a toy model
        runs[f"axis.math_word_problems_r{r}"] = np.where(runs["r"] == r, 0.0, np.nan)
        runs[f"axis.math_word_problems_r{r}_se"] = 0.0
    runs["axis.math_word_problems_chance"] = 0.0
    result = downstream(runs.drop(columns=["axis.math_word_problems_r0", "se", "chance"]))
    assert result.curves["math_word_problems"] is None
    assert result.verdict("math_word_problems") == "at equal loss on math word problems: not tested (every model " \
                                                   "scored 0.000)"


def test_two_designs_at_matched_loss_find_a_planted_difference_and_not_one_where_there_is_none():
    from loopscale.analysis.downstream.columns import axis_chance, axis_column, axis_se
    from loopscale.analysis.downstream.designs import design_lines

    def sweep(rng, planted):
        table = simulated_axis(rng)
        if planted:  # design B: the same curve in loss, shifted by ``planted`` at every r
            table["score"] = table["score"] + planted
        runs = pd.DataFrame({"run_id": [f"m{i}" for i in range(len(table))], "stage": "search", "status": "ok",
                             "r": table["r"], "budget_flops": table["budget_flops"], "width": 16.0,
                             "val_loss": table["loss"]})
        for r in (1, 2, 4):
            mine = table["r"] == r
            runs[axis_column("reasoning_primitives", r)] = np.where(mine, table["score"], np.nan)
            runs[axis_se("reasoning_primitives", r)] = np.where(mine, table["se"], np.nan)
        runs[axis_chance("reasoning_primitives")] = CHANCE
        return runs

    rng = np.random.default_rng(6)
    [line] = design_lines(sweep(rng, 0.0), sweep(rng, 0.12), "base", "mine")
    assert line.startswith("at equal loss on reasoning primitives, mine - base = +1") and line.endswith(
        "more than its loss predicts")
    verdicts = [design_lines(sweep(rng, 0.0), sweep(rng, 0.0), "a", "b")[0].rsplit(": ", 1)[1] for _ in range(40)]
    assert verdicts.count("cannot tell from none") >= 34  # about 5% of 40 may fall outside by chance
