"""``loopscale predict``: a run's loss and the compute-optimal N and D with intervals, from a sweep's bootstrap
draws or the published law; bad requests refused before any fit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from loopscale.analysis import SizeCurve, allocation_table, fit_joint_law
from loopscale.analysis.cli import main
from loopscale.analysis.predict import predict, prediction_lines
from loopscale.model import PAPER_LAW, PAPER_PHI_CI, JointLaw, tokens_for_budget
from test_analysis_sim import paper_runs

BATCH = 262_144


@pytest.fixture(scope="module")
def fit():
    return fit_joint_law(paper_runs(noise=0.01), n_starts=60, n_bootstrap=30)


def test_a_width_s_loss_interval_is_the_percentile_over_the_sweep_s_draws(fit):
    result = predict(fit, 1e20, 4, width=2048)
    curve = SizeCurve.from_model(4)
    tokens = tokens_for_budget(curve.config(2048), 1e20, BATCH)
    sizes = curve.sizes(2048)
    assert result["width_tokens"] == tokens
    losses = [JointLaw(**row).loss(sizes["N_once"], sizes["N_rec"], 4, tokens)
              for row in fit.draws().to_dict("records")]
    tail = 100 * (1 - fit.confidence) / 2
    assert (result["width_loss_lo"], result["width_loss_hi"]) == pytest.approx(
        tuple(np.percentile(losses, [tail, 100 - tail])), rel=1e-9)
    assert result["width_loss"] == pytest.approx(fit.law.loss(sizes["N_once"], sizes["N_rec"], 4, tokens))
    assert result["width_loss_lo"] < result["width_loss"] < result["width_loss_hi"]
    # the compute-optimal point is the allocation table's, inside its interval
    row = allocation_table(fit, [1e20], [4]).iloc[0]
    for column in ("N", "tokens", "loss"):
        assert result[column] == row[column]
        assert result[f"{column}_lo"] <= result[column] <= result[f"{column}_hi"]


def test_the_published_law_s_interval_is_phi_s_alone():
    result = predict(PAPER_LAW, 1e20, 4, width=2048)
    assert "no interval but phi's" in result["note"]
    curve = SizeCurve.from_model(4)
    tokens = tokens_for_budget(curve.config(2048), 1e20, BATCH)
    sizes = curve.sizes(2048)
    ends = [dataclasses.replace(PAPER_LAW, phi=phi).loss(sizes["N_once"], sizes["N_rec"], 4, tokens)
            for phi in PAPER_PHI_CI]
    assert (result["width_loss_lo"], result["width_loss_hi"]) == pytest.approx((min(ends), max(ends)), rel=1e-12)


def test_predict_from_a_sweep_through_the_cli(tmp_path, capsys):
    path = tmp_path / "sweep.csv"
    paper_runs(noise=0.01).to_csv(path, index=False)
    assert main(["predict", "--experiment", str(path), "--budget", "1e19", "--r", "4", "--width", "1024",
                 "--n-starts", "60", "--n-bootstrap", "30"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].startswith("budget 1.00e19 FLOPs, r=4; intervals: 95% intervals from the fit's 30 "
                               "block-bootstrap draws")
    assert lines[1].startswith("compute-optimal: N ") and " nats" in lines[1] and "(" in lines[1]
    assert any(line.startswith("width 1024: N ") for line in lines)
    assert "phi 0.4" in err and "95% CI" in err
    assert all(len(line) <= 120 for line in (out + err).splitlines())


def test_predict_with_the_published_law_says_so(capsys):
    assert main(["predict", "--law", "paper", "--budget", "1e19", "--r", "1"]) == 0
    out = capsys.readouterr().out
    assert "the published law carries no interval but phi's (95% CI 0.41 to 0.53)" in out.replace("\n  ", " ")
    assert all(len(line) <= 120 for line in out.splitlines())


@pytest.mark.parametrize("argv, message", [
    (["--width", "2000"], "--width 2000 is not buildable: widths are multiples of head_dim 128"),
    (["--r", "3"], "r=3 does not divide"),
    (["--budget", "1e10"], "buys no optimizer step"),
])
def test_bad_requests_are_one_line_before_any_fit(tmp_path, capsys, argv, message):
    path = tmp_path / "sweep.csv"
    paper_runs(noise=0.01).to_csv(path, index=False)
    request = {"--budget": "1e19", "--r": "4"}
    request.update(dict(zip(argv[::2], argv[1::2])))
    before = sorted(tmp_path.rglob("*"))
    assert main(["predict", "--experiment", str(path), *sum(request.items(), ())]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "fitted" not in err, err
    assert sorted(tmp_path.rglob("*")) == before


def test_a_one_head_model_is_one_head():
    """The buildable line said "width 128 (1 heads)" at the narrowest width."""
    p = predict(PAPER_LAW, 1e15, 1)
    assert p["heads_built"] == 1
    assert any(line.startswith("buildable: width 128 (1 head), N ") for line in prediction_lines(p, BATCH))
