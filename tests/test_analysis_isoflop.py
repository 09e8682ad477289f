"""Per-cell IsoFLOP optima, their flags and intervals; the Pareto frontier; per-r power laws."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from loopscale.analysis import allocation_table, cell_optima, pareto_frontier, power_laws
from loopscale.analysis.isoflop import cell_gaps, pooled_sigma
from loopscale.model import PAPER_LAW
from test_analysis_sim import paper_runs


@pytest.fixture(scope="module")
def clean_runs():
    return paper_runs()


@pytest.fixture(scope="module")
def law_optima(clean_runs):
    budgets = sorted(clean_runs["budget_flops"].unique())
    return allocation_table(PAPER_LAW, budgets, [1, 2, 4, 8])


def one_cell(curvature, vertex, r=1, budget=1e18):
    """A cell of the paper grid whose loss is 2.8 + curvature (u - vertex)^2, u = log N rescaled to [0, 1]."""
    cell = paper_runs(grid={budget: (6, 8, 10, 12, 14)}, recurrences=(r,))
    x = np.log(cell["N_once"] + cell["N_rec"])
    u = (x - x.min()) / (x.max() - x.min())
    return cell.assign(val_loss=2.8 + curvature * (u - vertex) ** 2)


def test_an_exact_parabola_gives_its_vertex():
    cell = paper_runs(grid={1e18: (6, 8, 10, 12, 14)}, recurrences=(2,))
    x = np.log(cell["N_once"] + cell["N_rec"])
    vertex = x.iloc[1] + 0.3 * (x.iloc[3] - x.iloc[1])
    cell["val_loss"] = 2.9 + 0.05 * (x - vertex) ** 2
    row = cell_optima(cell, n_bootstrap=20).table.iloc[0]
    assert row["status"] == "ok"
    assert row["N_opt"] == pytest.approx(np.exp(vertex), rel=1e-9)
    assert row["L_opt"] == pytest.approx(2.9, abs=1e-12)
    # D*, N_once*, N_rec* are interpolated between the runs, so they sit between the neighbours' values
    assert cell["tokens"].iloc[3] < row["D_opt"] < cell["tokens"].iloc[1]
    assert row["N_once_opt"] + row["N_rec_opt"] == pytest.approx(row["N_opt"], rel=1e-3)
    assert row["tokens_per_param"] == pytest.approx(row["D_opt"] / row["N_opt"])
    # residuals are zero, so every bootstrap resample gives the same vertex
    assert row["N_lo"] == pytest.approx(row["N_opt"]) and row["N_hi"] == pytest.approx(row["N_opt"])


@pytest.mark.parametrize("curvature, vertex, status, reason", [
    (0.1, 1.3, "no_interior_minimum", "above the largest size"),
    (0.1, -0.3, "no_interior_minimum", "below the smallest size"),
    (0.1, 0.6, "ok", ""),
    (0.1, 0.99, "ok", ""),
    (-0.1, 0.5, "no_interior_minimum", "opens downward"),
])
def test_cells_without_an_interior_minimum_are_flagged(curvature, vertex, status, reason):
    row = cell_optima(one_cell(curvature, vertex), n_bootstrap=0).table.iloc[0]
    assert row["status"] == status and reason in row["reason"]
    assert np.isfinite(row.get("N_opt", np.nan)) == (status == "ok")


def test_too_few_points_are_flagged():
    cell = paper_runs(grid={1e18: (8, 10)}, recurrences=(1,))
    row = cell_optima(cell).table.iloc[0]
    assert row["status"] == "too_few_points" and "2 distinct sizes" in row["reason"]


def test_noise_free_grid_optima_match_the_law(clean_runs, law_optima):
    table = cell_optima(clean_runs, n_bootstrap=50).table
    ok = table[table["status"] == "ok"]
    assert len(ok) == 20  # the other 4 cells' grids stop short of the optimum (flagged, not extrapolated)
    both = ok.merge(law_optima, on=["budget_flops", "r"])
    assert ((both["N_opt"] / both["N"] - 1).abs() < 0.03).all()  # parabola in log N vs the exact optimum
    assert ((both["L_opt"] - both["loss"]).abs() < 1e-3).all()
    assert ((both["width_opt"] / both["width"] - 1).abs() < 0.02).all()
    assert (ok["N_lo"] <= ok["N_hi"]).all() and ok["boot_valid"].between(0, 1).all()
    # looped models want wider widths at the same budget
    for _, cells in ok.groupby("budget_flops"):
        assert cells.sort_values("r")["width_opt"].is_monotonic_increasing


def test_measured_gaps_match_the_law(clean_runs, law_optima):
    gaps = cell_gaps(cell_optima(clean_runs, n_bootstrap=0).table).merge(law_optima, on=["budget_flops", "r"])
    assert len(gaps) >= 12
    assert ((gaps["gap_to_r1"] - gaps["loss_gap_to_r1"]).abs() < 2e-3).all()


def test_power_laws_recover_the_laws_exponents(clean_runs, law_optima):
    laws = power_laws(cell_optima(clean_runs, n_bootstrap=50)).set_index(["r", "quantity"])
    for r in (1, 2, 4, 8):
        mine = law_optima[law_optima["r"] == r]
        log_c = np.log(mine["budget_flops"])
        for quantity, column in (("N", "N"), ("D", "tokens")):
            truth = np.polyfit(log_c, np.log(mine[column]), 1)[0]
            row = laws.loc[(r, quantity)]
            assert row["exponent"] == pytest.approx(truth, abs=0.02)
            assert row["exponent_lo"] <= row["exponent"] <= row["exponent_hi"]
    assert set(laws.index.get_level_values("quantity")) == {"N", "D", "L", "tokens_per_param"}


def test_noisy_cells_get_intervals_that_widen_with_noise():
    quiet = cell_optima(paper_runs(noise=0.002), n_bootstrap=100).table
    loud = cell_optima(paper_runs(noise=0.01), n_bootstrap=100).table
    width = {name: np.nanmedian(np.log(t["N_hi"] / t["N_lo"])) for name, t in (("quiet", quiet), ("loud", loud))}
    assert width["loud"] > width["quiet"] > 0


def test_frontier_is_exactly_the_non_dominated_runs():
    runs = paper_runs(noise=0.01)
    front = pareto_frontier(runs)
    overall = front[front["group"] == "all"]
    spent = runs["flops_spent"].to_numpy()
    loss = runs["val_loss"].to_numpy()
    dominated = np.array([((spent <= s) & (loss < l)).any() for s, l in zip(spent, loss)])
    assert set(overall["run_id"]) == set(runs["run_id"][~dominated])
    assert overall["training_flops"].is_monotonic_increasing and overall["val_loss"].is_monotonic_decreasing
    for r in (1, 2, 4, 8):
        mine = front[front["group"] == f"r={r}"]
        assert (mine["r"] == r).all() and len(mine) >= 2


def test_frontier_skips_unusable_rows():
    runs = paper_runs(noise=0.01)
    best = runs["val_loss"].idxmin()
    assert runs.loc[best, "run_id"] in set(pareto_frontier(runs)["run_id"])  # the lowest loss is on the frontier
    runs.loc[best, "status"] = "diverged"
    assert runs.loc[best, "run_id"] not in set(pareto_frontier(runs)["run_id"])  # until it is unusable


def test_empty_input_gives_empty_tables():
    runs = paper_runs().assign(status="failed")
    assert cell_optima(runs).table.empty
    assert power_laws(cell_optima(runs)).empty
    assert pareto_frontier(runs).empty


def parabola_sweep(rng, sigma, *, three_point_cells=1, big_cells=4):
    """Cells of loss 2.5 + 0.05 (log N - log N0)^2 plus Gaussian noise ``sigma``: some of 3 runs, some of 6."""
    cells = []
    for i in range(three_point_cells + big_cells):
        cell = paper_runs(grid={1e18 * (i + 1): (6, 8, 10) if i < three_point_cells else (6, 8, 10, 12, 14, 16)},
                          recurrences=(1,))
        x = np.log(cell["N_once"] + cell["N_rec"])
        centre = np.log(cell["N_once"] + cell["N_rec"]).iloc[1]  # the optimum is the middle run of the 3
        cells.append(cell.assign(val_loss=2.5 + 0.05 * (x - centre) ** 2 + sigma * rng.standard_normal(len(x))))
    return pd.concat(cells, ignore_index=True)


def test_pooled_sigma_recovers_the_noise():
    rng = np.random.default_rng(1)
    runs = parabola_sweep(rng, 0.02, three_point_cells=0, big_cells=40)
    cells = [cell for _, cell in runs.groupby("budget_flops")]
    assert pooled_sigma(cells) == pytest.approx(0.02, rel=0.1)
    assert np.isnan(pooled_sigma([cell.iloc[:3] for cell in cells]))  # no cell with runs to spare


def test_a_three_point_cell_gets_a_parametric_interval_that_covers():
    """Over many sweeps with known noise, the 3-run cell's 95% interval of L* holds the true 2.5 about 95% of
    the time (a parametric bootstrap from the noise pooled over the other cells)."""
    rng = np.random.default_rng(2)
    covered, total = 0, 0
    for _ in range(200):
        table = cell_optima(parabola_sweep(rng, 0.004), n_bootstrap=200, seed=int(rng.integers(1 << 30))).table
        row = table.iloc[0]
        assert row["n_points"] == 3
        if row["status"] != "ok":  # noise can turn a parabola of 3 points over: no optimum, no interval
            continue
        assert row["interval"].startswith("parametric bootstrap, pooled noise")
        assert np.isfinite([row["N_lo"], row["N_hi"], row["D_lo"], row["D_hi"], row["L_lo"], row["L_hi"]]).all()
        total += 1
        covered += row["L_lo"] <= 2.5 <= row["L_hi"]
    assert total > 170 and 0.88 <= covered / total <= 0.995, (covered, total)


def test_without_a_cell_to_pool_noise_from_a_three_point_cell_has_no_interval():
    table = cell_optima(parabola_sweep(np.random.default_rng(3), 0.01, big_cells=0), n_bootstrap=50).table
    row = table.iloc[0]
    assert np.isnan(row["N_lo"]) and row["interval"].startswith("none: no cell has more than 3 runs")
