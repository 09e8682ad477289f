"""``loopscale compare`` lists the spec keys two sweeps set differently and warns where a difference cannot
change the loss (the simulate objective never reads the recipe and sees the injection only as sizes)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from loopscale.analysis.spec_diff import inert_differences, spec_differences
from test_spec import write_spec


def test_differences_are_dotted_keys_without_where_keys():
    a = {"name": "a", "tracking_uri": "sqlite:///x", "budgets": [1e12], "template": {"injection": "linear"},
         "recipe": {"base_lr": 0.04}}
    b = {"name": "b", "tracking_uri": "sqlite:///y", "budgets": [1e12], "template": {"injection": "additive"},
         "widths": {"s_max": 8}}
    assert spec_differences(a, b) == [("recipe.base_lr", 0.04, "(unset)"),
                                      ("template.injection", "linear", "additive"),
                                      ("widths.s_max", "(unset)", 8)]
    assert spec_differences(a, {**a, "name": "c"}) == []


def test_only_differences_the_objective_ignores_are_flagged():
    differences = [("recipe.base_lr", 0.04, 0.01), ("template.injection", "linear", "additive"),
                   ("budgets", [1e12], [1e13])]
    warnings = inert_differences(differences, "simulate", "simulate")
    assert len(warnings) == 2
    assert warnings[0].startswith("recipe.base_lr differs, but the simulate objective never reads it")
    assert warnings[1].startswith("template.injection differs, but the simulate objective ignores it")
    assert inert_differences(differences, "train", "train") == []
    assert "different objectives" in inert_differences(differences, "train", "simulate")[0]


@pytest.mark.integration
@pytest.mark.slow
def test_compare_two_real_sweeps_names_the_injection_and_warns(tmp_path):
    spec = write_spec(tmp_path, recurrences=[1, 2], budgets=[1e12, 1e13], trials_per_cell=3)

    def loopscale(*argv):
        done = subprocess.run([sys.executable, "-m", "loopscale.search.cli", *argv], cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    loopscale("search", str(spec), "--set", "name=base")
    loopscale("search", str(spec), "--set", "name=additive", "--set", 'template.injection="additive"')
    out = loopscale("compare", "base", "additive", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
                    "--n-starts", "30", "--n-bootstrap", "20")
    listed = out.split("spec keys that differ (base -> additive):\n")[1].split("warning: ")
    # the name and the store differ too, but say nothing about the design
    assert listed[0] == "  template.injection: 'linear' -> 'additive'\n"
    assert listed[1].startswith("template.injection differs, but the simulate objective ignores it")
