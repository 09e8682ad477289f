"""Tokenizers: UTF-8 bytes (the default, nothing to download) or any Hugging Face ``tokenizers`` JSON file.

Every document is followed by a separator token so packed sequences can tell documents apart: byte 0 (NUL,
which text never contains) for bytes, and the file's end-of-text token when it has one.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

BYTES = "bytes"
# Names end-of-text tokens go by in common tokenizer files; the first one present is the separator.
EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]")


@dataclass(frozen=True)
class Tokenizer:
    """What the data pipeline needs from a tokenizer: a stable identity for the fingerprint, the vocabulary
    size, the separator id, and batch encoding to int arrays."""

    identity: str            # "bytes" or "file:<sha256 of the JSON>"
    vocab_size: int
    eos_id: int | None
    byte_level: bool         # one token per UTF-8 byte (bits per byte = nats per token / ln 2)
    backend: Any = None      # tokenizers.Tokenizer for files

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        if self.byte_level:
            return [np.frombuffer(text.encode("utf-8"), dtype=np.uint8) for text in texts]
        return [np.asarray(enc.ids, dtype=np.int64)
                for enc in self.backend.encode_batch(texts, add_special_tokens=False)]


def check_tokenizer(spec: Any) -> None:
    """Raise ValueError (one line) unless ``spec`` is "bytes" or the path of an existing JSON file."""
    if spec == BYTES:
        return
    if not isinstance(spec, str):
        raise ValueError(f"data.tokenizer must be 'bytes' or a path to a tokenizers JSON file, got {spec!r}")
    if not os.path.isfile(spec):
        raise ValueError(f"data.tokenizer: no such file {spec!r} (use 'bytes' or a tokenizers JSON file)")


def tokenizer_identity(spec: str) -> str:
    """"bytes", or "file:" + the SHA-256 of the tokenizer file (so an edited file makes a new cache)."""
    if spec == BYTES:
        return BYTES
    with open(spec, "rb") as f:
        return "file:" + hashlib.sha256(f.read()).hexdigest()


def load_tokenizer(spec: str) -> Tokenizer:
    """The tokenizer named by a data spec's ``tokenizer`` entry."""
    check_tokenizer(spec)
    if spec == BYTES:
        return Tokenizer(identity=BYTES, vocab_size=256, eos_id=0, byte_level=True)
    try:
        from tokenizers import Tokenizer as HFTokenizer  # optional dependency, needed only for tokenizer files
    except ImportError as err:
        raise ValueError("data.tokenizer is a file, which needs the 'tokenizers' package: "
                         "pip install tokenizers") from err
    try:
        backend = HFTokenizer.from_file(spec)
    except Exception as err:  # the Rust side raises its own exception type for malformed files
        raise ValueError(f"data.tokenizer: {spec!r} is not a tokenizers JSON file ({err})") from err
    vocab = backend.get_vocab(with_added_tokens=True)
    eos = next((vocab[name] for name in EOS_NAMES if name in vocab), None)
    return Tokenizer(identity=tokenizer_identity(spec), vocab_size=backend.get_vocab_size(with_added_tokens=True),
                     eos_id=eos, byte_level=False, backend=backend)
