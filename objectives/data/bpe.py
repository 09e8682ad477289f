"""A byte-level BPE trained on the sweep's own data source, so that no spec depends on a file nobody has.

``tokenizer = "bpe"`` in a data spec asks for it. It is trained with Hugging Face ``tokenizers`` (the GPT-2
recipe: byte-level pre-tokenisation, all 256 bytes in the initial alphabet so any text encodes, one special
token ``<|endoftext|>`` as the document separator) on the first ``tokenizer_train_chars`` characters of the
source's seeded document stream (the same stream the packed cache reads, validation documents first: a
tokenizer learns text statistics only, and every trial of a sweep shares it), up to ``tokenizer_vocab`` tokens.
A small corpus may run out of merges first: the embedded KJV text (4.1 MB) stops near 21,000 tokens, which a
32,064-token model simply leaves unused.

It is cached as ``<cache_dir>/tokenizers/bpe-<vocab>-<hash>.json`` (and a ``.meta.json`` saying how many
characters it was trained on) beside the packed data, where the hash covers
the source's stream (source, options, seed, local files' sizes and times) and the training settings; the packed
data's fingerprint covers that hash in turn. Written to a temporary file and renamed into place: concurrent
builders agree and a crash leaves no half file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from .sources import document_batches
from .spec import BPE, normalize_data, source_identity
from .tokenizers import Tokenizer, from_backend, load_tokenizer, tokenizer_identity

BPE_FORMAT = 1  # bump when the training recipe below changes: old caches are then not reused
EOS = "<|endoftext|>"
FOLDER = "tokenizers"
# Keys that do not change which text the tokenizer is trained on.
_NOT_SOURCE = ("tokenizer", "tokenizer_vocab", "tokenizer_train_chars", "max_tokens")


@dataclass(frozen=True)
class TrainedBPE:
    """Where a trained BPE lies and what it is: its fingerprint, vocabulary, the characters it was trained on,
    and the seconds training took (0 when it came from the cache)."""

    path: str
    fingerprint: str
    vocab_size: int
    train_chars: int
    seconds: float


def bpe_fingerprint(data: dict[str, Any]) -> str:
    """Hash of a normalised ``bpe`` spec's training text and settings (module docstring)."""
    stream = {k: v for k, v in data.items() if k not in _NOT_SOURCE}
    identity = {**source_identity(stream), "bpe_format": BPE_FORMAT, "vocab": data["tokenizer_vocab"],
                "train_chars": data["tokenizer_train_chars"]}
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def tokenizer_fingerprint(data: dict[str, Any]) -> str:
    """The tokenizer's part of the packed data's fingerprint: ``bpe:<hash>`` for a trained BPE, else the
    tokenizer's own identity (bytes, a file's content hash, a hub id)."""
    if data["tokenizer"] == BPE:
        return f"bpe:{bpe_fingerprint(data)}"
    return tokenizer_identity(data["tokenizer"])


def train_bpe(data: dict[str, Any] | None, cache_dir: str) -> TrainedBPE:
    """Train the spec's BPE (or find it cached under ``cache_dir``); idempotent, safe against concurrent calls."""
    data = normalize_data(data)
    if data["tokenizer"] != BPE:
        raise ValueError(f"data.tokenizer is {data['tokenizer']!r}; set tokenizer = 'bpe' to train one")
    fingerprint = bpe_fingerprint(data)
    folder = os.path.join(cache_dir, FOLDER)
    path = os.path.join(folder, f"bpe-{data['tokenizer_vocab']}-{fingerprint}.json")
    if os.path.isfile(path):
        return _described(path, fingerprint, 0.0)
    from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers

    started = time.perf_counter()
    backend = HFTokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=data["tokenizer_vocab"], special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = _TrainingText(data, os.path.join(cache_dir, "hf-datasets"))
    backend.train_from_iterator(texts, trainer=trainer)
    if texts.chars == 0:
        raise ValueError(f"data source {data['source']!r} yielded no text to train a BPE on")
    os.makedirs(folder, exist_ok=True)
    # what it was trained on, beside it (the tokenizer file takes no extra fields); written first, as the
    # tokenizer file's arrival is what marks the cache complete
    _write_atomic(path.removesuffix(".json") + ".meta.json",
                  lambda tmp: _dump({"fingerprint": fingerprint, "train_chars": texts.chars}, tmp), folder)
    _write_atomic(path, backend.save, folder)
    return _described(path, fingerprint, time.perf_counter() - started)


def open_tokenizer(data: dict[str, Any], cache_dir: str) -> Tokenizer:
    """The tokenizer of a normalised data spec, training its BPE first when it asks for one."""
    if data["tokenizer"] != BPE:
        return load_tokenizer(data["tokenizer"])
    from tokenizers import Tokenizer as HFTokenizer

    trained = train_bpe(data, cache_dir)
    return from_backend(f"bpe:{trained.fingerprint}", HFTokenizer.from_file(trained.path))


class _TrainingText:
    """The spec's documents, in stream order, until ``tokenizer_train_chars`` characters were handed out
    (the last document cut); counts what it yielded in ``chars``."""

    def __init__(self, data: dict[str, Any], hf_cache_dir: str):
        self.data, self.hf_cache_dir, self.chars = data, hf_cache_dir, 0

    def __iter__(self):
        limit = self.data["tokenizer_train_chars"]
        for batch in document_batches(self.data, self.hf_cache_dir):
            for doc in batch:
                doc = doc[: limit - self.chars]
                self.chars += len(doc)
                yield doc
                if self.chars >= limit:
                    return


def _write_atomic(path: str, write: Any, folder: str) -> None:
    """``write(tmp)`` to a temporary file in ``folder``, then rename it to ``path``."""
    fd, tmp = tempfile.mkstemp(prefix=".bpe-", suffix=".json", dir=folder)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _dump(obj: dict[str, Any], path: str) -> None:
    with open(path, "w") as f:
        json.dump(obj, f)


def _described(path: str, fingerprint: str, seconds: float) -> TrainedBPE:
    from tokenizers import Tokenizer as HFTokenizer

    with open(path.removesuffix(".json") + ".meta.json") as f:
        meta = json.load(f)
    vocab = HFTokenizer.from_file(path).get_vocab_size(with_added_tokens=True)
    return TrainedBPE(path=path, fingerprint=fingerprint, vocab_size=vocab, train_chars=meta["train_chars"],
                      seconds=seconds)
