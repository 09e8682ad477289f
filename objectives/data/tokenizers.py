"""Tokenizers: UTF-8 bytes (the default), a byte-level BPE trained on the sweep's own data, a Hugging Face
``tokenizers`` JSON file, or a tokenizer on the Hugging Face hub.

A data spec's ``tokenizer`` entry names one of them::

    "bytes"                        one token per UTF-8 byte; nothing to train or download
    "bpe"                          a byte-level BPE of ``tokenizer_vocab`` tokens trained on the data source
                                   itself (objectives.data.bpe), cached beside the packed data
    "path/to/tokenizer.json"       an existing tokenizers JSON file (e.g. the Llama-2 tokenizer's)
    "owner/name"                   a hub repository holding a tokenizer.json, loaded when the hub is reachable

Every document is followed by a separator token so packed sequences can tell documents apart: byte 0 (NUL,
which text never contains) for bytes, and the tokenizer's end-of-text token when it has one.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from .sources import check_hub_reachable
from .spec import BPE, BYTES, normalize_data, tokenizer_kind

# Names end-of-text tokens go by in common tokenizer files; the first one present is the separator.
EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]")


@dataclass(frozen=True)
class Tokenizer:
    """What the data pipeline needs from a tokenizer: a stable identity for the fingerprint, the vocabulary
    size, the separator id, and batch encoding to int arrays."""

    identity: str            # "bytes", "file:<sha256 of the JSON>" or "hub:<repository>"
    vocab_size: int
    eos_id: int | None
    byte_level: bool         # one token per UTF-8 byte (bits per byte = nats per token / ln 2)
    backend: Any = None      # tokenizers.Tokenizer for everything but bytes

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        if self.byte_level:
            return [np.frombuffer(text.encode("utf-8"), dtype=np.uint8) for text in texts]
        return [np.asarray(enc.ids, dtype=np.int64)
                for enc in self.backend.encode_batch(texts, add_special_tokens=False)]


def tokenizer_identity(spec: str) -> str:
    """"bytes", "file:" + the SHA-256 of the tokenizer file (an edited file makes a new cache), or
    "hub:" + the repository. (A trained BPE is identified by its training fingerprint: data.bpe.)"""
    kind = tokenizer_kind(spec)
    if kind == "file":
        with open(spec, "rb") as f:
            return "file:" + hashlib.sha256(f.read()).hexdigest()
    return f"hub:{spec}" if kind == "hub" else spec


def load_tokenizer(spec: str) -> Tokenizer:
    """The tokenizer named by ``spec``: bytes, a file or a hub id ("bpe" is trained first: data.bpe)."""
    kind = tokenizer_kind(spec)
    if kind == BYTES:
        return Tokenizer(identity=BYTES, vocab_size=256, eos_id=0, byte_level=True)
    if kind == BPE:
        raise ValueError("data.tokenizer 'bpe' is trained on the data first (objectives.data.bpe.train_bpe)")
    from tokenizers import Tokenizer as HFTokenizer  # imported only when a tokenizer is really used

    if kind == "hub":
        check_hub_reachable(f"tokenizer {spec!r}")
        try:
            backend = HFTokenizer.from_pretrained(spec)
        except Exception as err:  # the Rust side raises its own exception types (no repo, no tokenizer.json)
            raise ValueError(f"data.tokenizer: hub repository {spec!r} has no loadable tokenizer.json "
                             f"({_first_line(err)})") from None
        return from_backend(f"hub:{spec}", backend)
    try:
        backend = HFTokenizer.from_file(spec)
    except Exception as err:  # the Rust side raises its own exception type for malformed files
        raise ValueError(f"data.tokenizer: {spec!r} is not a tokenizers JSON file ({_first_line(err)})") from None
    return from_backend(tokenizer_identity(spec), backend)


def vocab_size_of(data: dict[str, Any] | None) -> int:
    """Vocabulary size the model needs for this data: 256 for bytes, alphabet + 1 for synthetic data,
    ``tokenizer_vocab`` for a BPE still to be trained (an upper bound: a small corpus may run out of merges),
    the tokenizer's vocabulary for a file or a hub id."""
    data = normalize_data(data)
    if data["source"] == "synthetic":
        return data["alphabet"] + 1
    if data["tokenizer"] == BPE:
        return data["tokenizer_vocab"]
    return load_tokenizer(data["tokenizer"]).vocab_size


def from_backend(identity: str, backend: Any) -> Tokenizer:
    """Wrap a ``tokenizers.Tokenizer``: its full vocabulary (added tokens included) and its end-of-text id."""
    vocab = backend.get_vocab(with_added_tokens=True)
    eos = next((vocab[name] for name in EOS_NAMES if name in vocab), None)
    return Tokenizer(identity=identity, vocab_size=backend.get_vocab_size(with_added_tokens=True), eos_id=eos,
                     byte_level=False, backend=backend)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__
