"""``seeds = "per_trial"``: each trained trial initialises and orders its batches from its own seed, a function of
the sweep's seed and the trial's key; ``"shared"`` (the default) leaves every sweep, trial and batch order as
before the key existed."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from loopscale.objectives import TrialConfig, train
from loopscale.objectives.data.batches import Batches
from loopscale.objectives.data.cache import open_packed, prepare_data
from loopscale.search import SweepSpec
from loopscale.search.tune.studies import make_studies, trial_seed
from test_spec import write_spec

TRAIN = {"objective": "train", "data": {"source": "kjv"}, "recipe": {"log_every": 2, "ref_batch": 512}}


def proposals(spec: SweepSpec, n: int) -> list[TrialConfig]:
    """The first ``n`` trials each search cell of ``spec`` proposes, in cell order."""
    return [study.ask()[1] for study in make_studies(spec, "search", None) for _ in range(n)]


def test_per_trial_seeds_are_the_trial_keys_and_shared_ones_change_nothing(tmp_path):
    plain = SweepSpec.from_toml(write_spec(tmp_path, **TRAIN))
    shared = SweepSpec.from_toml(write_spec(tmp_path, "shared.toml", seeds="shared", **TRAIN))
    own = SweepSpec.from_toml(write_spec(tmp_path, "own.toml", seeds="per_trial", **TRAIN))
    assert plain.spec_hash == shared.spec_hash != own.spec_hash  # an existing sweep stays resumable

    before = proposals(plain, 2)
    assert all(t.seed == 0 and t.order_seed is None and "order_seed" not in t.to_params() for t in before)
    trials = proposals(own, 2)
    keys = [(c.key, n) for c in own.cells() for n in (1, 2)]
    assert [t.seed for t in trials] == [trial_seed(0, "search", key, n) for key, n in keys]
    assert len({t.seed for t in trials}) == len(trials) and all(t.order_seed == t.seed for t in trials)
    assert [dataclasses.replace(t, seed=0, order_seed=None) for t in trials] == before  # the same widths
    assert proposals(own, 2) == trials  # a second run of the spec (or a restored sweep) trains the same seeds
    for t in trials:
        assert TrialConfig.from_params(t.to_params()) == t
    zero = dataclasses.replace(trials[0], order_seed=0)  # a seed of 0 is a seed, not "unset"
    assert TrialConfig.from_params(zero.to_params()).order_seed == 0


def test_seeds_is_checked_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="^bad.toml: seeds must be one of shared, per_trial, got 'each'"):
        SweepSpec.from_toml(write_spec(tmp_path, "bad.toml", seeds="each", **TRAIN))
    with pytest.raises(ValueError, match="order_seed must be a whole number >= 0 or unset, got -1"):
        TrialConfig(budget_flops=1e9, r=1, s=1.0, template={}, batch_tokens=64, order_seed=-1)


def test_a_simulated_sweep_draws_its_noise_per_trial_whichever_is_set(tmp_path):
    """The demo preset takes seeds per trial and still replays with ``--objective simulate``: the same trials."""
    shared = proposals(SweepSpec.from_toml(write_spec(tmp_path)), 2)
    assert proposals(SweepSpec.from_toml(write_spec(tmp_path, "own.toml", seeds="per_trial")), 2) == shared
    demo = SweepSpec.from_toml("demo", objective="simulate", tracking_uri=f"sqlite:///{tmp_path}/unused.db")
    assert demo.sampling.seeds == "per_trial" and all(t.seed == 0 for t in proposals(demo, 1))


def test_an_order_seed_reorders_the_batches_and_none_keeps_the_data_seeds_order(tmp_path):
    cache = str(tmp_path / "cache")
    packed = open_packed(cache, prepare_data({"source": "kjv"}, 64, cache, 1024))
    rows = len(packed.train)
    legacy = np.random.default_rng([packed.meta["data"]["seed"], 3, 0]).permutation(rows)[:8]
    shared, again = Batches(packed, 8), Batches(packed, 8, order_seed=None)
    assert list(shared.rows(0)) == list(again.rows(0)) == list(legacy)  # the order every existing trial trained in
    one, other = Batches(packed, 8, order_seed=5), Batches(packed, 8, order_seed=6)
    assert list(one.rows(0)) == list(Batches(packed, 8, order_seed=5).rows(0))
    assert len({tuple(b.rows(s)) for b in (shared, one, other) for s in (0,)}) == 3
    assert sorted(one._perm(0)) == list(range(rows))  # still every row once an epoch


def test_two_trials_of_one_width_train_apart_with_their_own_seeds_and_alike_with_one(tmp_path):
    """Real training, 8 steps each: the same trial twice ends bit for bit alike; the cell's next proposal at the
    same width, with its own seed, ends elsewhere (its initialisation and batch order differ)."""
    template = {"depth": 3, "prelude": 1, "coda": 1, "width_unit": 16, "head_dim": 16, "vocab_size": 256,
                "seq_len": 64}
    base = TrialConfig(budget_flops=1.5e9, s=2.0, r=1, template=template, batch_tokens=512,
                       data={"source": "kjv"}, cache_dir=str(tmp_path / "cache"), val_tokens=1024, num_threads=1,
                       recipe={"log_every": 4, "ref_batch": 512})
    first, second = (dataclasses.replace(base, seed=s, order_seed=s) for s in (trial_seed(0, "search", "c", n)
                                                                              for n in (1, 2)))
    a, again, b = train(first), train(first), train(second)
    assert a["steps"] == b["steps"] >= 4
    assert a["val_loss"] == again["val_loss"] and a["train_loss"] == again["train_loss"]
    assert a["val_loss"] != b["val_loss"]
