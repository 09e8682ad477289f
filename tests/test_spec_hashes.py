"""A sweep started by an earlier loopscale resumes after an upgrade: the spec hash of every shipped preset, and
of specs with the optional keys set, is the one recorded in tests/fixtures/spec_hashes.json (computed by the
code that started those sweeps), and a finished sweep's real state folder (tests/fixtures/smoke-sweep.tar.gz:
``loopscale search smoke --objective simulate``) resumes as complete, with no run added.

The smoke preset changed (its own vocabulary and law), and so did the demo (a seed per trial); the cases built on
them before are kept on copies of the earlier files (tests/fixtures/smoke-v1.toml, demo-v1.toml), so the hashes of
sweeps started from them stay pinned. A spec replayed with ``--objective simulate`` took iso_depth's 32,064-token
vocabulary beside its ``[data]`` before; it takes the data's now (the design it trains): a sweep simulated before
resumes with ``--set template.vocab_size=32064``, the cases ``*-simulate`` say so, ``*-simulate-data`` pin the
design as it is simulated now."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from loopscale.search import SweepSpec

FIXTURES = Path(__file__).parent / "fixtures"
SMOKE_V1 = str(FIXTURES / "smoke-v1.toml")
DEMO_V1 = str(FIXTURES / "demo-v1.toml")
LAW = "simulate.law={E = 1.5, A = 400.0, alpha = 0.3, B = 400.0, beta = 0.3, phi = 0.5}"
OLD_VOCAB = "template.vocab_size=32064"  # a simulated replay's vocabulary before it took [data]'s (module docstring)
# name -> (preset, --objective, --set items); the stores are set per test (they are not hashed)
CASES: dict[str, tuple[str, str | None, tuple[str, ...]]] = {
    "smoke": (SMOKE_V1, None, ()),
    "demo": (DEMO_V1, None, ()),
    "paper": ("paper", None, ()),
    "smoke-simulate": (SMOKE_V1, "simulate", (OLD_VOCAB,)),
    "demo-simulate": (DEMO_V1, "simulate", (OLD_VOCAB,)),
    "smoke-simulate-data": (SMOKE_V1, "simulate", ()),
    "demo-simulate-data": (DEMO_V1, "simulate", ()),
    "paper-simulate": ("paper", "simulate", ()),
    "smoke-train": (SMOKE_V1, "train", ()),
    "information": (SMOKE_V1, None, ("information=0.5",)),
    "branches": (SMOKE_V1, None, ("branches=true",)),
    "branches-deferred-2": (SMOKE_V1, None, ("branches=true", "deferred_budgets=2")),
    "branches-deferred-0": (SMOKE_V1, None, ("branches=true", "deferred_budgets=0")),
    "tolerance": (SMOKE_V1, None, ("tolerance=0.05",)),
    "rounds-true": (SMOKE_V1, None, ("rounds=true",)),
    "rounds-false": (SMOKE_V1, None, ("rounds=false",)),
    "tokens-per-param": (SMOKE_V1, None, ("widths.tokens_per_param=[5, 400]",)),
    "law-and-noise": (SMOKE_V1, None, (LAW, "simulate.cell_noise=0.02", "simulate.misspec=0.01")),
    "template": (SMOKE_V1, None, ("template.injection=additive", "template.bptt_k=2", "template.vocab_size=300")),
    "hyperconnect": (SMOKE_V1, None, ("template.injection=hyperconnect", "template.lanes=2")),
    "placement": (SMOKE_V1, None, ("resources.workers=2", "resources.max_concurrent=3", "resources.retries=0",
                                  "resources.checkpoint_s=0.5",
                                  'address=""')),
    "resources": (SMOKE_V1, None, ("resources.cpus=2", "resources.gpus=1")),
    "grid": (SMOKE_V1, None, ("sampler=gp", "first_guess_tokens_per_param=30", "seed=7", "min_steps=5",
                             "trials_per_cell=2", "budgets=[1e12, 3e12]", "recurrences=[1, 2]",
                             "seq_len=32", "batch_tokens=256", "val_tokens=1024", "name=other")),
    "widths": (SMOKE_V1, None, ("widths.s_min=2", "widths.s_max=8")),
    "recipe": (SMOKE_V1, None, ("recipe.base_lr=0.03", "calibrate.trials=2", "calibrate.param=base_lr")),
    "bpe": (SMOKE_V1, None, ("data.tokenizer=bpe", "calibrate.budget=5e10")),
    "smoke-preset": ("smoke", None, ()),
    "smoke-preset-simulate": ("smoke", "simulate", ()),
    "demo-set": (DEMO_V1, None, ("trials_per_cell=2", "recipe.branch_budgets=[3e11]", "branches=true")),
    "demo-preset": ("demo", None, ()),
    "demo-preset-simulate": ("demo", "simulate", (OLD_VOCAB,)),
    "demo-preset-simulate-data": ("demo", "simulate", ()),
}


def load(case: str, tmp_path: Path) -> SweepSpec:
    preset, objective, sets = CASES[case]
    stores = (f"storage={tmp_path / 'tune'}", f"cache_dir={tmp_path / 'cache'}",
              f"tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}")
    return SweepSpec.from_toml(preset, [*sets, *stores], objective=objective)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_hash_of_a_started_sweep_is_kept(case, tmp_path):
    expected = json.loads((FIXTURES / "spec_hashes.json").read_text())
    assert load(case, tmp_path).spec_hash == expected[case]


def test_rounds_are_on_by_default_for_a_sampler_that_reads_results_and_every_spec_keeps_its_hash(tmp_path):
    """``rounds`` defaulted to false before: a spec that leaves it out, or writes false, hashed as one, and still
    does (a sweep started then resumes), though it now proposes in rounds unless it writes false."""
    unwritten, off, on = (load(case, tmp_path) for case in ("smoke", "rounds-false", "rounds-true"))
    assert (unwritten.sampling.rounds, off.sampling.rounds, on.sampling.rounds) == (True, False, True)
    assert unwritten.spec_hash == off.spec_hash != on.spec_hash
    grid = SweepSpec.from_toml(SMOKE_V1, ["sampler=grid", f"storage={tmp_path / 'tune'}"])
    assert not grid.sampling.rounds  # a grid's proposals read no results: rounds would only cost time


def test_a_sweep_started_before_rounds_were_the_default_resumes_without_them(tmp_path):
    from loopscale.search.tune.driver import SweepState

    spec = load("smoke", tmp_path)
    started_before = {"spec_hash": spec.spec_hash, "complete": False}  # sweep.json as the earlier code wrote it
    assert SweepState.rounds(started_before, spec) is False
    assert SweepState.rounds(started_before, load("rounds-true", tmp_path)) is True
    assert SweepState.rounds(SweepState.fresh(spec), spec) is True


def test_where_a_sweep_runs_is_not_hashed(tmp_path):
    assert load("placement", tmp_path).spec_hash == load("smoke", tmp_path / "elsewhere").spec_hash


def _runs(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("select count(*) from runs").fetchone()[0]


def test_a_finished_sweep_of_an_earlier_version_resumes(tmp_path):
    with tarfile.open(FIXTURES / "smoke-sweep.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    db = tmp_path / "mlflow.db"
    before = _runs(db)
    assert before == 19  # the sweep's parent run and its 18 trials
    out = subprocess.run(
        [sys.executable, "-m", "loopscale.search.cli", "search", SMOKE_V1, "--objective", "simulate", "--resume",
         "--set", OLD_VOCAB,
         "--set", f"storage={tmp_path / 'tune'}", "--set", f"cache_dir={tmp_path / 'cache'}",
         "--set", f"tracking_uri=sqlite:///{db}"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "already complete" in out.stdout and "nothing to do" in out.stdout, out.stdout
    assert _runs(db) == before
