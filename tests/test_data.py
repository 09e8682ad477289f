"""The data pipeline on real data: the embedded KJV corpus, the synthetic corpus, local files, a tokenizer file."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from loopscale.objectives import data_fingerprint, open_packed, prepare_data, synthetic_entropy_floor, validate_data, \
    vocab_size_of
from loopscale.objectives.data.batches import Batches
from loopscale.objectives.data.bpe import bpe_fingerprint, tokenizer_fingerprint
from loopscale.objectives.data.sources import kjv_chapters
from loopscale.objectives.data.spec import normalize_data
from loopscale.objectives.data.synthetic import synthetic_params, true_log_probs
from loopscale.objectives.training import trial_data
from loopscale.objectives import TrialConfig

T = 128
VAL_TOKENS = 8192
TEMPLATE = dict(depth=8, prelude=2, coda=2, width_unit=16, head_dim=16, seq_len=T, vocab_size=256)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data-cache"))


@pytest.fixture(scope="module")
def kjv(cache_dir):
    return open_packed(cache_dir, prepare_data({"source": "kjv"}, T, cache_dir, VAL_TOKENS))


def test_embedded_corpus_builds_offline(tmp_path):
    """A fresh process with every Hugging Face offline switch set builds the default cache (no network)."""
    script = ("import sys; from loopscale.objectives import prepare_data, open_packed; "
              "fp = prepare_data({}, 64, sys.argv[1], 1024); p = open_packed(sys.argv[1], fp); "
              "print(fp, len(p.train), len(p.val))")
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "cache")], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    fingerprint, n_train, n_val = out.stdout.split()
    assert fingerprint.startswith("kjv-T64-")
    assert int(n_val) == 1024 // 64 and int(n_train) > 50_000  # ~4.1 MB of text in 65-byte rows


def test_kjv_is_the_whole_bible_as_chapters():
    chapters = kjv_chapters()
    assert len(chapters) == 1189
    assert chapters[0].startswith("In the beginning God created")
    assert 4.0e6 < sum(len(c) for c in chapters) < 4.4e6
    assert not any(":" in c.split("\n")[0][:6] for c in chapters)  # verse labels are stripped


def test_validation_and_training_documents_are_disjoint(kjv):
    """Every whole document in either split is a KJV chapter, and no chapter appears in both."""
    chapters = {c: i for i, c in enumerate(kjv_chapters())}

    def chapter_ids(rows: np.ndarray) -> tuple[set[int], int]:
        text = bytes(np.asarray(rows, dtype=np.uint8).reshape(-1)).decode("utf-8", errors="replace")
        pieces = text.split("\0")[1:-1]  # drop the pieces cut by the split's ends
        ids = {chapters[p] for p in pieces if p in chapters}
        return ids, len(pieces)

    val_ids, val_pieces = chapter_ids(kjv.val)
    train_ids, train_pieces = chapter_ids(kjv.train)
    assert len(val_ids) == val_pieces >= 2 and len(train_ids) == train_pieces  # pieces are whole chapters
    assert not val_ids & train_ids
    assert len(val_ids) + len(train_ids) >= 1189 - 4  # only the pieces cut at the ends are missing
    assert len(kjv.val) == math.ceil(VAL_TOKENS / T)


def test_two_architectures_see_identical_batches(cache_dir):
    """Trials of one sweep that differ in shape read byte-identical training batches and validation rows."""
    base = dict(budget_flops=1e12, batch_tokens=4096, data={"source": "kjv"}, cache_dir=cache_dir,
                val_tokens=VAL_TOKENS, template=TEMPLATE)
    looped, plain = TrialConfig(**base, s=8.0, r=4, seed=1), TrialConfig(**base, s=2.0, r=1, seed=0)
    a, b = (trial_data(tc, tc.model_config) for tc in (looped, plain))
    assert looped.model_config.width != plain.model_config.width and a.rows_per_step == b.rows_per_step == 32
    steps = len(a.packed.train) // a.rows_per_step + 3  # cross an epoch boundary
    for step in (0, 1, 2, steps - 4, steps - 3, steps - 1):
        assert a.batch(step).tobytes() == b.batch(step).tobytes()
    assert np.asarray(a.packed.val).tobytes() == np.asarray(b.packed.val).tobytes()
    first = np.concatenate([a.rows(s) for s in range(len(a.packed.train) // a.rows_per_step)])
    assert len(np.unique(first)) == len(first)  # an epoch reads every row at most once


def test_batch_order_depends_on_the_data_seed(cache_dir):
    one = open_packed(cache_dir, prepare_data({"source": "kjv", "seed": 1}, T, cache_dir, VAL_TOKENS))
    zero = open_packed(cache_dir, prepare_data({"source": "kjv"}, T, cache_dir, VAL_TOKENS))
    assert one.meta["fingerprint"] != zero.meta["fingerprint"]
    assert Batches(one, 8).batch(0).tobytes() != Batches(zero, 8).batch(0).tobytes()


def test_cache_is_reused_and_a_failed_build_leaves_nothing(tmp_path, cache_dir):
    fingerprint = prepare_data({"source": "kjv"}, T, cache_dir, VAL_TOKENS)
    stamps = {path: path.stat().st_mtime_ns for path in Path(cache_dir).rglob("*")}
    assert prepare_data({"source": "kjv"}, T, cache_dir, VAL_TOKENS) == fingerprint
    assert {path: path.stat().st_mtime_ns for path in Path(cache_dir).rglob("*")} == stamps  # reused, not rebuilt

    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(json.dumps({"body": f"doc {i}"}) for i in range(50)))
    spec = {"source": "files", "path": str(bad)}  # the default text_field "text" is missing
    out = tmp_path / "cache"
    with pytest.raises(ValueError, match="no column 'text'"):
        prepare_data(spec, 16, str(out), 32)
    assert not out.exists()  # no half cache, no temporary directory, not even the folder it made


def test_synthetic_corpus_matches_its_entropy_floor(cache_dir):
    """Scored under the distribution that generated it, the cached stream's loss is the computed floor."""
    spec = {"source": "synthetic", "seed": 3, "tokens": 400_000}
    packed = open_packed(cache_dir, prepare_data(spec, T, cache_dir, VAL_TOKENS))
    params = synthetic_params(spec)
    record = params["key_len"] + params["value_len"] + 1
    floor = synthetic_entropy_floor(spec)
    for split in (packed.val, packed.train):
        lp = true_log_probs(np.asarray(split).reshape(-1), params, seed=3)
        per_record = -lp[: len(lp) // record * record].reshape(-1, record).sum(axis=1) / record
        se = per_record.std() / math.sqrt(len(per_record))  # records are independent
        assert abs(per_record.mean() - floor) < 4 * se, (per_record.mean(), floor, se)
    assert floor < packed.meta["unigram_entropy"] - 1.0  # context is worth a lot on this corpus
    assert vocab_size_of(spec) == packed.meta["vocab_size"] == params["alphabet"] + 1


def test_synthetic_floor_in_closed_cases():
    # Uniform keys over every digit string, no noise: only the key digits are uncertain.
    spec = {"zipf": 0.0, "n_keys": 64 * 64, "noise": 0.0}
    assert synthetic_entropy_floor(spec) == pytest.approx(2 * math.log(64) / 7)
    # Pure noise: values are uniform too.
    spec = {"zipf": 0.0, "n_keys": 64 * 64, "noise": 1.0}
    assert synthetic_entropy_floor(spec) == pytest.approx(6 * math.log(64) / 7)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "text"])
def test_local_files_through_datasets(tmp_path, fmt):
    chapters = kjv_chapters()[:60]
    if fmt == "jsonl":
        path = tmp_path / "docs.jsonl"
        path.write_text("\n".join(json.dumps({"content": c}) for c in chapters))
        spec = {"source": "files", "path": str(path), "text_field": "content"}
    elif fmt == "parquet":
        import pandas as pd

        path = tmp_path / "docs.parquet"
        pd.DataFrame({"text": chapters}).to_parquet(path)
        spec = {"source": "files", "path": str(path)}
    else:
        path = tmp_path / "docs.txt"
        path.write_text("\n\n".join(c.strip() for c in chapters))
        spec = {"source": "files", "path": str(path), "sample_by": "paragraph"}
    validate_data(spec)
    packed = open_packed(str(tmp_path / "c"), prepare_data(spec, 64, str(tmp_path / "c"), 1024))
    text = bytes(np.asarray(packed.train, dtype=np.uint8).reshape(-1)).decode("utf-8", errors="replace")
    pieces = text.split("\0")[1:-1]
    assert packed.meta["train_docs"] + packed.meta["val_docs"] == 60
    assert pieces and all(p in {c.strip() for c in chapters} | set(chapters) for p in pieces)


def test_tokenizer_file(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(kjv_chapters()[:200], trainer)
    path = str(tmp_path / "tok.json")
    tok.save(path)
    spec = {"source": "kjv", "tokenizer": path}
    vocab = vocab_size_of(spec)
    assert 300 < vocab <= 400
    packed = open_packed(str(tmp_path / "c"), prepare_data(spec, 64, str(tmp_path / "c"), 2048))
    eos = tok.token_to_id("<|endoftext|>")
    assert int(np.asarray(packed.train).max()) < vocab and (np.asarray(packed.train) == eos).sum() > 1000
    assert 1.5 < packed.meta["bytes_per_token"] < 4  # merges pack several bytes per token
    assert data_fingerprint(spec, 64, 2048) != data_fingerprint({"source": "kjv"}, 64, 2048)


def test_hub_fails_at_once_offline(tmp_path, monkeypatch):
    spec = {"source": "hub", "name": "HuggingFaceFW/fineweb-edu", "config": "sample-10BT"}
    validate_data(spec)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(ValueError, match="needs the Hugging Face hub but HF_DATASETS_OFFLINE is set"):
        prepare_data(spec, 64, str(tmp_path), 1024)
    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(ValueError, match="cannot reach the Hugging Face hub at 127.0.0.1:9"):
        prepare_data(spec, 64, str(tmp_path), 1024)
    assert time.perf_counter() - start < 10
    assert os.listdir(tmp_path) == []  # nothing half-written


@pytest.mark.parametrize("spec, message", [
    ({"source": "kjb"}, "unknown source 'kjb' (did you mean 'kjv'?)"),
    ({"source": "kjv", "sed": 1}, "unknown key 'sed' for source 'kjv' (did you mean 'seed'?)"),
    ({"source": "kjv", "seed": "one"}, "data.seed must be an integer"),
    ({"source": "kjv", "seed": True}, "data.seed must be an integer"),
    ({"source": "files"}, "source 'files' needs 'path'"),
    ({"source": "files", "path": "/no/such/file.jsonl"}, "no such file '/no/such/file.jsonl'"),
    ({"source": "files", "path": __file__}, "cannot tell the format"),
    ({"source": "files", "path": __file__, "format": "csv"}, "unknown format 'csv'"),
    ({"source": "kjv", "tokenizer": "/no/tok.json"}, "no such file '/no/tok.json'"),
    ({"source": "synthetic", "n_keys": 10_000, "alphabet": 64, "key_len": 2}, "does not fit"),
    ({"source": "synthetic", "noise": 1.5}, "noise must be in"),
    ({"source": "synthetic", "tokenizer": "bytes", "zipf": "x"}, "data.zipf must be a number"),
    ({"source": "hub"}, "source 'hub' needs 'name'"),
    ({"source": "kjv", "max_tokens": 0}, "max_tokens must be >= 1"),
    ("kjv", "data must be a table"),
])
def test_bad_specs_fail_with_one_clear_line(spec, message):
    with pytest.raises(ValueError) as err:
        validate_data(spec)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_vocab_sizes():
    assert vocab_size_of({}) == vocab_size_of({"source": "kjv"}) == 256
    assert vocab_size_of({"source": "synthetic", "alphabet": 10, "n_keys": 50}) == 11


# The compatibility contract: caches and trained tokenizers already on users' disks are found by these strings, so
# they must never change (literal values, computed by the code as it stood before the data package was laid out).
# A files source is left out: its fingerprint covers the files' paths and modification times.
PINNED_FINGERPRINTS = {
    "kjv default": (None, "kjv-T128-508b5c207ce61d9f", "kjv-T64-0bc2a331b40e4a8e", "bytes"),
    "kjv seed, cap": ({"source": "kjv", "seed": 1, "max_tokens": 100_000}, "kjv-T128-07bec3dc96ba520c",
                      "kjv-T64-2dcfc59d997e0a04", "bytes"),
    "synthetic": ({"source": "synthetic", "seed": 3, "tokens": 400_000}, "synthetic-T128-84f42b3caf21a1a5",
                  "synthetic-T64-103cc732e3b685d3", "bytes"),
    "bpe": ({"source": "kjv", "tokenizer": "bpe", "tokenizer_vocab": 300, "tokenizer_train_chars": 200_000},
            "kjv-T128-14b10def463842ad", "kjv-T64-38ae8a95fe6aefd0", "bpe:3209d95a1db3964f"),
    "bpe default": ({"tokenizer": "bpe"}, "kjv-T128-5b7ee170110b9c5c", "kjv-T64-193c221ea749cd18",
                    "bpe:971e0e2eeddfe982"),
    "hub": ({"source": "hub", "name": "HuggingFaceFW/fineweb-edu", "config": "sample-10BT"},
            "hub-T128-0f0f3a36d27b47c2", "hub-T64-efb73fe986ba47d9", "bytes"),
}


@pytest.mark.parametrize("name", PINNED_FINGERPRINTS)
def test_fingerprints_are_pinned(name):
    spec, at_128, at_64, tokenizer = PINNED_FINGERPRINTS[name]
    assert data_fingerprint(spec, 128, 8192) == at_128
    assert data_fingerprint(spec, 64, 1024) == at_64
    assert tokenizer_fingerprint(normalize_data(spec)) == tokenizer
    if tokenizer.startswith("bpe:"):
        assert "bpe:" + bpe_fingerprint(normalize_data(spec)) == tokenizer


def test_a_tokenizer_files_fingerprint_is_pinned(tmp_path):
    path = tmp_path / "tok.json"  # identified by its content alone (not its path or time)
    path.write_text('{"not": "parsed"}\n')
    assert tokenizer_fingerprint(normalize_data({"tokenizer": str(path)})) == \
        "file:987b84023fce69b14b2e038441e1b207f06dedf05a199c9c65c445a7ff083270"


def test_the_batch_order_is_pinned(kjv):
    """A resumed checkpoint reads on from its step's batch, so the order of the rows is part of the same contract
    (literal values from the code before the data package was laid out)."""
    batches = Batches(kjv, 8)
    assert len(kjv.train) == 32009
    assert batches.rows(0).tolist() == [14685, 804, 3483, 6192, 17938, 30947, 26620, 7131]
    # step 4001 crosses into the second epoch
    assert batches.rows(4001).tolist() == [21407, 26116, 17637, 5704, 26139, 31657, 28390, 4326]
    assert int(batches.batch(3, rank=1, world=2).sum()) == 45874
