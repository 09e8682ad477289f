"""Delta-phi as one model: two simulated sweeps with a known Delta, a base law they share, Delta's profile interval
and its test of Delta = 0; the matched cells beside it; r = 1 runs borrowed only from an equal template, by
compare and by ``analyze --baseline`` alike. (Coverage over many pairs: tests/benchmarks/bench_delta_coverage.py.)"""

from __future__ import annotations

import json

import pytest

from loopscale.analysis.borrow import borrow_refusal, with_borrowed_r1
from loopscale.analysis.cli import main
from loopscale.analysis.compare import compare_runs
from loopscale.analysis.options import FitOptions
from loopscale.model import PAPER_LAW, JointLaw
from test_analysis_sim import PAPER_GRID, TEMPLATE, paper_runs

QUICK = FitOptions(n_starts=40, n_bootstrap=20)
LOW = {c: PAPER_GRID[c] for c in list(PAPER_GRID)[:4]}


def pair(delta: float, seed: int, noise: float = 0.02):
    """A baseline sweep (the paper's law) and a variant whose phi is ``delta`` higher, r > 1 only, 4 budgets."""
    variant = JointLaw(**{**PAPER_LAW.to_dict(), "phi": PAPER_LAW.phi + delta})
    return (paper_runs(noise=noise, seed=2 * seed), paper_runs(variant, noise=noise, seed=2 * seed + 1, grid=LOW,
                                                               recurrences=(2, 4, 8)))


@pytest.mark.parametrize("delta, seed", [(0.0, 0), (0.0, 1), (0.2, 0), (0.2, 1), (-0.15, 2)])
def test_the_profile_interval_of_delta_covers_the_known_delta(delta, seed):
    base, variant = pair(delta, seed)
    result = compare_runs(base, variant, options=QUICK)
    shared = result.shared
    lo, hi = shared.ci
    assert lo <= delta <= hi, (delta, shared.ci)
    assert (not lo <= 0 <= hi) == (shared.p_zero <= 0.05), (shared.ci, shared.p_zero)
    assert shared.phi_b == pytest.approx(shared.phi_a + shared.delta)
    assert abs(shared.phi_a - PAPER_LAW.phi) < 0.1
    if delta:
        assert shared.p_zero < 0.05 and (result.verdict.startswith("A recurrence is worth more") == (delta > 0))
    else:
        assert result.verdict.startswith("No clear difference")


def test_matched_cells_count_those_that_favour_b():
    base, variant = pair(0.3, 3, noise=0.005)
    result = compare_runs(base, variant, options=QUICK)
    cells = result.cells
    assert len(cells) == 12 and set(cells["r"]) == {2, 4, 8}  # r = 1 is borrowed: no cell of B's own
    assert (cells["difference"] < 0).sum() >= 11  # a better loop: lower loss in (nearly) every matched cell
    assert (cells["lo"] <= cells["difference"]).all() and (cells["difference"] <= cells["hi"]).all()
    text = result.text()
    assert f"matched cells (model-free): {(cells['difference'] < 0).sum()} of 12 favour B" in text


def test_r1_runs_are_borrowed_only_from_an_equal_template():
    base, variant = pair(0.0, 0)
    assert borrow_refusal(base, variant, "search") == ""
    assert borrow_refusal(recorded(base), recorded(variant), "search") == ""
    base, other = recorded(base), recorded(variant, vocab_size=4096)
    refusal = borrow_refusal(base, other, "search")
    assert refusal.startswith("the templates differ in vocab_size")
    runs, note = with_borrowed_r1(other, base, "search")
    assert len(runs) == len(other) and note == f"borrows no r = 1 runs: {refusal}"
    runs, note = with_borrowed_r1(recorded(variant), base, "search")
    assert (runs["r"] == 1).sum() == 4 + 5 + 5 + 6 and note == "borrows the other sweep's 20 r = 1 runs"
    with pytest.raises(ValueError, match="has runs of one r only|one base law"):
        compare_runs(base, other.assign(r=2), options=QUICK)


def recorded(runs, **changes):
    """``runs`` with the template recorded as the search records it (a ``template.<key>`` column per key)."""
    return runs.assign(**{f"template.{key}": value for key, value in {**TEMPLATE, **changes}.items()})


def test_a_refused_borrow_leaves_no_one_model_and_says_why():
    base, _ = pair(0.0, 0)
    result = compare_runs(recorded(base, seq_len=1024), recorded(paper_runs(seed=5, noise=0.02, grid=LOW)),
                          options=QUICK)
    assert result.shared is None and "differ in seq_len" in result.shared_note
    assert "Delta-phi (B - A) = " in result.text() and "no one-model interval" in result.text()


def test_analyze_with_a_baseline_gives_compares_phi_for_b(tmp_path, capsys):
    base, variant = pair(0.2, 4)
    paths = {name: tmp_path / f"{name}.csv" for name in ("base", "variant")}
    base.to_csv(paths["base"], index=False)
    variant.to_csv(paths["variant"], index=False)
    argv = ["--n-starts", "40", "--n-bootstrap", "20"]
    out = tmp_path / "analysis"
    assert main(["analyze", "--experiment", str(paths["variant"]), "--baseline", str(paths["base"]), "--out", str(out),
                 "--no-log", *argv]) == 0
    assert "borrows the other sweep's 20 r = 1 runs" in capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())["joint"]
    result = compare_runs(base, variant, options=QUICK)
    assert summary["phi"] == pytest.approx(result.fit_b.phi, abs=1e-9)
    assert summary["phi_profile_ci"] == pytest.approx(list(result.fit_b.phi_profile_ci), abs=1e-9)
    assert summary["verdict"] == result.fit_b.verdict
    assert main(["predict", "--experiment", str(paths["variant"]), "--baseline", str(paths["base"]), "--budget", "1e18",
                 "--r", "2", *argv]) == 0
    assert f"phi {result.fit_b.phi:.3f}" in capsys.readouterr().err


def test_both_phi_stay_in_phi_s_bounds_at_every_delta():
    """Held at each Delta of its profile, phi_A and phi_B = phi_A + Delta both lie in phi's bounds (issue 63: a
    Delta of -6 beside phi's bound of -3, phi_B far below any phi a sweep can fit)."""
    base, variant = pair(0.0, 0)
    shared = compare_runs(base, variant, options=QUICK).shared
    lo, hi = QUICK.bounds.phi
    phi_a = shared.profile.thetas[:, 5]
    phi_b = phi_a + shared.profile.values
    assert ((lo <= phi_a) & (phi_a <= hi) & (lo - 1e-9 <= phi_b) & (phi_b <= hi + 1e-9)).all()
    assert lo <= shared.phi_a <= hi and lo <= shared.phi_b <= hi


def test_an_own_design_borrows_the_built_in_s_r1_runs_when_its_r1_model_is_the_same():
    """The relaxed recursive example is LoopedLM's plain stack at r = 1: its sweep borrows the built-in's r = 1 runs
    (issue 63: refused, "templates differ at r=1", for every own architecture). A design whose r = 1 model is
    another is refused in one line naming what differs, not the whole template."""
    from pathlib import Path

    examples = Path(__file__).resolve().parents[1] / "examples" / "architectures"
    base, variant = pair(0.0, 0)
    relaxed = recorded(variant, architecture=f"{examples / 'relaxed_recursive.py'}:build")
    assert borrow_refusal(recorded(base), relaxed, "search") == ""
    tiny = recorded(variant, architecture=f"{Path(__file__).parent / 'fixtures' / 'tiny_loop.py'}:tiny_loop")
    refusal = borrow_refusal(recorded(base), tiny, "search")
    assert refusal.startswith("the templates differ at r = 1: the template (architecture ") and "{" not in refusal
    assert ":tiny_loop) gives N " in refusal and ", r=1; the runs record " in refusal
