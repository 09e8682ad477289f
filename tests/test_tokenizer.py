"""Tokenizers no one has to supply: a byte-level BPE trained on the spec's own data and cached beside the packed
data (``loopscale tokenizer`` and ``search``), hub ids failing in one line offline, and specs that read data only
when their objective does (``loopscale plan paper`` works on a machine with no tokenizer file and no network)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from loopscale.objectives import open_packed, prepare_data, train_bpe, validate_data, vocab_size_of
from loopscale.objectives.data.bpe import bpe_fingerprint
from loopscale.objectives.data.sources import kjv_chapters
from loopscale.objectives.data.spec import normalize_data
from loopscale.objectives.data.tokenizers import load_tokenizer
from loopscale.search import SweepSpec
from loopscale.search.cli import main
from test_spec import write_spec

BPE = {"source": "kjv", "tokenizer": "bpe", "tokenizer_vocab": 300, "tokenizer_train_chars": 400_000}


def test_bpe_is_trained_on_the_source_cached_and_fingerprinted(tmp_path):
    cache = str(tmp_path / "cache")
    first = train_bpe(BPE, cache)
    assert first.vocab_size == 300 and first.seconds > 0
    assert first.train_chars == 400_000  # the first 400k characters of the seeded chapter stream
    assert os.path.dirname(first.path) == os.path.join(cache, "tokenizers")
    again = train_bpe(BPE, cache)
    assert (again.path, again.seconds) == (first.path, 0.0)  # cached, not retrained
    # every setting that changes the training text or the result changes the fingerprint
    base = bpe_fingerprint(normalize_data(BPE))
    for change in ({"tokenizer_vocab": 400}, {"tokenizer_train_chars": 300_000}, {"seed": 1}):
        assert bpe_fingerprint(normalize_data({**BPE, **change})) != base
    assert bpe_fingerprint(normalize_data({**BPE, "max_tokens": 10_000})) == base  # packing only

    packed = open_packed(cache, prepare_data(BPE, 64, cache, 1024))
    tok = load_tokenizer(first.path)
    assert packed.meta["vocab_size"] == 300 and packed.meta["tokenizer"] == f"bpe:{first.fingerprint}"
    assert 1.2 < packed.meta["bytes_per_token"] < 2  # 43 merges on top of the 256 bytes and the separator
    # packed rows decode back to the corpus' text, documents separated by <|endoftext|>
    ids = np.asarray(packed.train[:2000]).reshape(-1).tolist()
    text = tok.backend.decode(ids, skip_special_tokens=False)
    pieces = [p for p in text.split("<|endoftext|>")[1:-1] if p]
    assert pieces and set(pieces) <= set(kjv_chapters())
    assert len(os.listdir(os.path.join(cache, "tokenizers"))) == 2  # the tokenizer and its .meta.json


def test_a_failed_bpe_source_leaves_no_tokenizer(tmp_path):
    spec = {"source": "files", "path": str(tmp_path / "empty.jsonl"), "tokenizer": "bpe", "tokenizer_vocab": 300}
    (tmp_path / "empty.jsonl").write_text('{"text": ""}\n{"text": ""}\n')  # documents without text
    with pytest.raises(ValueError, match="no text to train a BPE on"):
        train_bpe(spec, str(tmp_path / "cache"))
    assert not (tmp_path / "cache" / "tokenizers").exists() or not os.listdir(tmp_path / "cache" / "tokenizers")


def test_spec_trains_a_bpe_of_its_template_vocabulary(tmp_path, capsys):
    path = write_spec(tmp_path, objective="train", template={"vocab_size": 320}, widths={"s_min": 1, "s_max": 4},
                      data={"source": "kjv", "tokenizer": "bpe", "tokenizer_train_chars": 300_000})
    spec = SweepSpec.from_toml(path)
    assert spec.training.data["tokenizer_vocab"] == 320 and spec.grid.template["vocab_size"] == 320
    assert main(["tokenizer", str(path)]) == 0
    out = capsys.readouterr().out
    assert "320 tokens (asked for 320)" in out and "trained in" in out and "300,000 characters" in out
    assert main(["tokenizer", str(path)]) == 0
    assert ", cached, " in capsys.readouterr().out


@pytest.mark.parametrize("variable", ["HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"])
def test_a_hub_tokenizer_offline_is_one_line(monkeypatch, variable):
    spec = {"source": "kjv", "tokenizer": "meta-llama/Llama-2-7b-hf"}
    validate_data(spec)  # a hub id is a valid name; only using it needs the network
    monkeypatch.setenv(variable, "1")
    with pytest.raises(ValueError) as err:
        vocab_size_of(spec)
    assert f"needs the Hugging Face hub but {variable} is set" in str(err.value) and "\n" not in str(err.value)


def test_a_hub_tokenizer_without_network_is_one_line(monkeypatch, tmp_path):
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(ValueError, match="cannot reach the Hugging Face hub at 127.0.0.1:9"):
        prepare_data({"source": "kjv", "tokenizer": "meta-llama/Llama-2-7b-hf"}, 64, str(tmp_path / "c"), 1024)
    assert not (tmp_path / "c").exists()  # nothing half-written


@pytest.mark.parametrize("tokenizer, message", [
    ("llama-2-tokenizer.json", "no such file 'llama-2-tokenizer.json'"),
    (7, "data.tokenizer must be"),
])
def test_bad_tokenizers_fail_with_one_line(tokenizer, message):
    with pytest.raises(ValueError) as err:
        validate_data({"source": "kjv", "tokenizer": tokenizer})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_bpe_settings_need_the_bpe_tokenizer():
    with pytest.raises(ValueError, match="data.tokenizer_vocab applies only with tokenizer = 'bpe'"):
        validate_data({"source": "kjv", "tokenizer_vocab": 300})
    with pytest.raises(ValueError, match="data.tokenizer_vocab must be >= 257"):
        validate_data({"source": "kjv", "tokenizer": "bpe", "tokenizer_vocab": 100})


def test_plan_paper_works_here(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # planning reads no data and no tokenizer
    assert main(["plan", "paper"]) == 0
    out = capsys.readouterr().out
    assert "C=2.15e+19,r=8" in out


def test_a_simulated_spec_takes_its_vocabulary_from_its_data_and_trains_no_tokenizer(tmp_path, capsys):
    """A simulated replay is of the design its spec trains (issue 63: it took iso_depth's 32,064 tokens beside a
    bytes tokenizer's 256), so its data's tokenizer must be one that gives a vocabulary."""
    missing = write_spec(tmp_path, data={"source": "kjv", "tokenizer": "no-such-tokenizer.json"})
    with pytest.raises(ValueError, match="no such file 'no-such-tokenizer.json'"):
        SweepSpec.from_toml(missing)
    path = write_spec(tmp_path, data={"source": "kjv"})
    spec = SweepSpec.from_toml(path)
    assert spec.objective == "simulate" and spec.grid.template["vocab_size"] == 256  # the bytes tokenizer's
    assert main(["plan", str(path)]) == 0
    assert main(["tokenizer", str(path)]) == 2
    assert "objective 'simulate' trains no model, so it needs no tokenizer" in capsys.readouterr().err
