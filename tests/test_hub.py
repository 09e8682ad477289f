"""The ``hub`` data source for real: ``datasets.load_dataset(..., streaming=True)`` on a dataset repository laid
out as on the Hugging Face hub (parquet shards under data/, a README.md whose YAML ``configs:`` name a config
and its split files), here a local directory: the same call a cluster makes with a hub id and the network."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from loopscale.objectives import data_fingerprint, open_packed, prepare_data, validate_data
from loopscale.objectives.data.sources import kjv_chapters

README = """---
configs:
- config_name: sample-en
  data_files:
  - split: train
    path: data/en/train-*
  - split: test
    path: data/en/test-*
- config_name: other
  data_files: data/other/*.parquet
---
# A dataset laid out as on the hub
"""


@pytest.fixture(autouse=True)
def short_stream_shutdown(monkeypatch):
    """datasets waits 5 s after each multi-shard stream for its prefetch threads to settle (apache/arrow#45214):
    noise on a cluster's hour-long build, most of this file's run time here; 0.2 s is ample for local shards."""
    import datasets

    monkeypatch.setattr(datasets.config, "SLEEP_TIME_ON_THREADS_SHUTDOWN", 0.2)


def write_hub_repo(root, chapters):
    """A dataset repository laid out as on the hub under ``root``: config ``sample-en`` with two train parquet
    shards (chapters 0-599) and a test shard (600-699); config ``other`` with one shard (700-709)."""
    (root / "data" / "en").mkdir(parents=True)
    (root / "data" / "other").mkdir(parents=True)
    for name, part in (("train-00000-of-00002", chapters[:300]), ("train-00001-of-00002", chapters[300:600]),
                       ("test-00000-of-00001", chapters[600:700])):
        pd.DataFrame({"id": range(len(part)), "text": part}).to_parquet(root / "data" / "en" / f"{name}.parquet")
    pd.DataFrame({"text": chapters[700:710]}).to_parquet(root / "data" / "other" / "x.parquet")
    (root / "README.md").write_text(README)
    return root


@pytest.fixture(scope="module")
def hub_repo(tmp_path_factory):
    chapters = kjv_chapters()
    return write_hub_repo(tmp_path_factory.mktemp("hub-repo"), chapters), chapters


def test_hub_source_streams_a_config_and_split(hub_repo, tmp_path, monkeypatch):
    root, chapters = hub_repo
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # a local repository needs no network
    spec = {"source": "hub", "name": str(root), "config": "sample-en", "split": "train", "shuffle_buffer": 50}
    validate_data(spec)
    packed = open_packed(str(tmp_path), prepare_data(spec, 64, str(tmp_path), 4096))
    assert packed.meta["train_docs"] + packed.meta["val_docs"] == 600  # both train shards, no test chapter
    text = bytes(np.asarray(packed.train, dtype=np.uint8).reshape(-1)).decode("utf-8", errors="replace")
    pieces = text.split("\0")[1:-1]
    assert pieces and set(pieces) <= set(chapters[:600])
    test_split = prepare_data({**spec, "split": "test"}, 64, str(tmp_path), 4096)
    assert open_packed(str(tmp_path), test_split).meta["train_docs"] + 64 > 100 - 64  # the test shard's chapters
    assert open_packed(str(tmp_path), test_split).meta["train_docs"] < 100


def test_the_shuffle_buffer_is_seeded(hub_repo, tmp_path):
    root, _ = hub_repo
    spec = {"source": "hub", "name": str(root), "config": "sample-en", "shuffle_buffer": 100}
    a = open_packed(str(tmp_path / "a"), prepare_data(spec, 64, str(tmp_path / "a"), 1024))
    b = open_packed(str(tmp_path / "b"), prepare_data(spec, 64, str(tmp_path / "b"), 1024))
    c = open_packed(str(tmp_path / "c"), prepare_data({**spec, "seed": 1}, 64, str(tmp_path / "c"), 1024))
    assert np.array_equal(a.train, b.train) and not np.array_equal(a.train[:100], c.train[:100])


def test_an_edited_shard_makes_a_new_fingerprint(hub_repo, tmp_path):
    root, chapters = hub_repo
    spec = {"source": "hub", "name": str(root), "config": "other"}
    before = data_fingerprint(spec, 64, 1024)
    pd.DataFrame({"text": chapters[700:712]}).to_parquet(root / "data" / "other" / "x.parquet")
    assert data_fingerprint(spec, 64, 1024) != before


def test_an_unknown_config_is_one_line(hub_repo, tmp_path):
    root, _ = hub_repo
    with pytest.raises(ValueError) as err:
        prepare_data({"source": "hub", "name": str(root), "config": "nope"}, 64, str(tmp_path / "c"), 1024)
    assert "could not be opened" in str(err.value) and "sample-en" in str(err.value)
    assert "\n" not in str(err.value) and not (tmp_path / "c").exists()


def test_a_bpe_trains_on_the_hub_stream(hub_repo, tmp_path):
    root, _ = hub_repo
    spec = {"source": "hub", "name": str(root), "config": "sample-en", "tokenizer": "bpe", "tokenizer_vocab": 300,
            "tokenizer_train_chars": 200_000}
    packed = open_packed(str(tmp_path), prepare_data(spec, 64, str(tmp_path), 1024))
    assert packed.meta["vocab_size"] == 300 and packed.meta["bytes_per_token"] > 1.2
