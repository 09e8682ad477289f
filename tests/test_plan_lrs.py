"""`loopscale plan` prints the learning rates every trial of a training sweep will use."""

from __future__ import annotations

import tomllib
from importlib import resources

from loopscale import objectives
from loopscale.analysis import numbers
from loopscale.analysis.flops import PAPER_GRID
from loopscale.search import SweepSpec
from loopscale.search.cli import main
from loopscale.search.plan.render import render_plan

from test_spec import to_toml


def paper_shaped(tmp_path, **recipe):
    """The paper preset (its template, grid, batch, MuonH recipe) on the embedded text, storing under tmp_path."""
    raw = tomllib.loads((resources.files("loopscale.search") / "presets" / "paper.toml").read_text())
    raw.update(data={"source": "kjv"}, tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
               storage=str(tmp_path / "tune"), cache_dir=str(tmp_path / "cache"))
    raw["recipe"].update(recipe)
    raw["resources"]["gpus"] = 0  # plan times a step on the trial's device; this machine has no CUDA
    path = tmp_path / "paper.toml"
    path.write_text(to_toml(raw))
    return path



def test_plan_prints_each_trials_rates(tmp_path, capsys):
    spec = SweepSpec.from_toml(paper_shaped(tmp_path))
    text = render_plan(spec, None, widths=True)
    assert "learning rates: muonh matrices (lr) and AdamW groups" in text and "calibration tunes base_lr" in text
    expected = [objectives.trial_lrs(spec.trial_config(cell, s)) for cell in spec.cells() for s in cell.widths]
    header = next(line for line in text.splitlines() if "lr_emb" in line)
    assert header.split()[-4:] == ["lr", "lr_emb", "lr_head", "lr_norm"]
    tables = text.splitlines()[text.splitlines().index(header):]  # the warnings' wrapped lines come before
    for line, lrs in zip([ln for ln in tables if ln.startswith("  ") and "width" not in ln], expected):
        assert line.split()[-4:] == [numbers.sig(lrs[g]) for g in ("matrices", "embedding", "lm_head", "norms")]
    # the data rule across the paper's budgets (docs/paper.md: 0.0072-0.0202 on its grid); the preset's two cheaper
    # budgets train on fewer tokens, so they get higher rates still
    paper = [objectives.trial_lrs(spec.trial_config(cell, s))["matrices"] for cell in spec.cells()
             if cell.budget in PAPER_GRID for s in cell.widths]
    assert 0.006 < min(paper) < 0.01 and 0.018 < max(paper) < 0.03
    assert max(lrs["matrices"] for lrs in expected) > max(paper)
    assert main(["plan", str(paper_shaped(tmp_path, base_lr=0.028)), "--widths"]) == 0
    out = capsys.readouterr().out
    assert "base_lr 0.028" in out and "lr_head" in out
