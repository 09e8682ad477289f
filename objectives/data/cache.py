"""Tokenise once, pack, and cache as memory-mapped arrays; trials only memory-map.

Packing (as the paper pre-packs 2,049-token sequences): documents, in the source's seeded order, each followed
by the separator token, are concatenated and cut into rows of ``T + 1`` tokens (inputs are a row's first T
tokens, targets its last T). The first documents fill the validation set, exactly
``ceil(val_tokens / T)`` rows (the document crossing that line is cut and its rest dropped), so validation and
training documents are disjoint. Every later document goes to training, up to ``max_tokens``. Which training
rows a step reads: objectives.data.batches.

Cache layout: ``cache_dir/<fingerprint>/{train.bin, val.bin, meta.json}``. A cache is built in a temporary
directory beside it and renamed into place as the last step, so a crash never leaves a half cache and
concurrent builders agree on one result.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from loopscale.model.user_cache import user_cache_dir

from .bpe import open_tokenizer, tokenizer_fingerprint
from .sources import document_batches
from .spec import normalize_data, source_identity

FORMAT_VERSION = 1
META = "meta.json"
FLUSH_TOKENS = 1 << 20


def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/loopscale/data`` (``~/.cache/loopscale/data``): used when a trial names none."""
    return user_cache_dir("data")


def data_fingerprint(data: dict[str, Any] | None, seq_len: int, val_tokens: int) -> str:
    """``<source>-T<seq_len>-<hash>``: the hash covers the full spec (source, its options, seed, split size),
    the tokenizer's content, the sequence length and, for local files, their sizes and modification times."""
    data = normalize_data(data)
    identity = {**source_identity(data), "format_version": FORMAT_VERSION, "seq_len": seq_len,
                "val_tokens": val_tokens, "tokenizer": tokenizer_fingerprint(data)}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()
    return f"{data['source']}-T{seq_len}-{digest[:16]}"


def prepare_data(data: dict[str, Any] | None, seq_len: int, cache_dir: str, val_tokens: int) -> str:
    """Build the packed cache for ``data`` (or reuse a complete one) and return its fingerprint.

    Called once on the driver before trials start; idempotent and safe against crashes and concurrent calls.
    """
    _check_positive_int("seq_len", seq_len)
    _check_positive_int("val_tokens", val_tokens)
    fingerprint = data_fingerprint(data, seq_len, val_tokens)
    final = os.path.join(cache_dir, fingerprint)
    if os.path.isfile(os.path.join(final, META)):
        return fingerprint
    created = _first_missing(cache_dir)  # removed again if the build fails: bad data leaves nothing behind
    os.makedirs(cache_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{fingerprint}.", dir=cache_dir)
    try:
        meta = _build(normalize_data(data), seq_len, val_tokens, tmp, cache_dir)
        meta["fingerprint"] = fingerprint
        with open(os.path.join(tmp, META), "w") as f:
            json.dump(meta, f, indent=1, default=str)
        try:
            os.rename(tmp, final)
        except OSError:
            if not os.path.isfile(os.path.join(final, META)):  # lost a race only if the winner finished
                raise
            shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if created:
            shutil.rmtree(created, ignore_errors=True)
        raise
    return fingerprint


def _first_missing(path: str) -> str | None:
    """The outermost directory on the way to ``path`` that does not exist yet (None when ``path`` exists)."""
    path, missing = os.path.abspath(path), None
    while not os.path.exists(path):
        missing, path = path, os.path.dirname(path)
    return missing


@dataclass
class PackedData:
    """A memory-mapped cache: ``train`` (n, T + 1) and ``val`` (m, T + 1) token rows, and its metadata."""

    meta: dict[str, Any]
    train: np.ndarray
    val: np.ndarray

    @property
    def seq_len(self) -> int:
        return self.meta["seq_len"]


def open_packed(cache_dir: str, fingerprint: str) -> PackedData:
    """Memory-map the cache ``fingerprint`` under ``cache_dir`` (read-only)."""
    path = os.path.join(cache_dir, fingerprint)
    try:
        with open(os.path.join(path, META)) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"no data cache {fingerprint!r} under {cache_dir!r}; run prepare_data first") from None
    width = meta["seq_len"] + 1
    maps = {split: np.memmap(os.path.join(path, f"{split}.bin"), dtype=meta["dtype"], mode="r",
                             shape=(meta[f"{split}_rows"], width)) for split in ("train", "val")}
    return PackedData(meta=meta, train=maps["train"], val=maps["val"])


class _RowWriter:
    """Appends token arrays to a raw binary file in whole rows; counts token frequencies of what it keeps."""

    def __init__(self, path: str, row: int, dtype: np.dtype, vocab_size: int, limit: int | None = None):
        self.file = open(path, "wb")
        self.row, self.dtype, self.limit = row, dtype, limit
        self.pending: list[np.ndarray] = []
        self.pending_tokens = 0
        self.rows = 0
        self.counts = np.zeros(vocab_size, dtype=np.int64)

    @property
    def tokens(self) -> int:
        return self.rows * self.row + self.pending_tokens

    @property
    def full(self) -> bool:
        return self.limit is not None and self.tokens >= self.limit

    def write(self, ids: np.ndarray) -> None:
        if self.limit is not None:
            ids = ids[: self.limit - self.tokens]
        self.pending.append(ids)
        self.pending_tokens += len(ids)
        if self.pending_tokens >= FLUSH_TOKENS:
            self._flush()

    def close(self) -> None:
        self._flush()
        self.file.close()

    def _flush(self) -> None:
        if not self.pending:
            return
        stream = np.concatenate(self.pending)
        whole = len(stream) // self.row * self.row
        rows, rest = stream[:whole].astype(self.dtype), stream[whole:]
        rows.tofile(self.file)
        self.counts += np.bincount(rows, minlength=len(self.counts))[: len(self.counts)]
        self.rows += whole // self.row
        self.pending, self.pending_tokens = ([rest], len(rest)) if len(rest) else ([], 0)


def _build(data: dict[str, Any], seq_len: int, val_tokens: int, out: str, cache_dir: str) -> dict[str, Any]:
    """Tokenise, split and pack ``data`` into ``out`` (a BPE trained first lands in ``cache_dir``; whatever
    ``datasets`` writes for local files under its hf-datasets folder); returns the metadata (without the
    fingerprint)."""
    synthetic = data["source"] == "synthetic"
    tokenizer = None if synthetic else open_tokenizer(data, cache_dir)
    vocab = data["alphabet"] + 1 if synthetic else tokenizer.vocab_size
    eos = None if synthetic else tokenizer.eos_id  # synthetic records close themselves with SEP
    dtype = np.dtype(np.uint16 if vocab <= 1 << 16 else np.uint32)
    row = seq_len + 1
    val_rows = math.ceil(val_tokens / seq_len)
    val = _RowWriter(os.path.join(out, "val.bin"), row, dtype, vocab, limit=val_rows * row)
    train = _RowWriter(os.path.join(out, "train.bin"), row, dtype, vocab, limit=data.get("max_tokens"))
    docs = {"val": 0, "train": 0}
    val_bytes = val_doc_tokens = 0
    try:
        for batch in document_batches(data, os.path.join(cache_dir, "hf-datasets")):
            encoded = batch if synthetic else tokenizer.encode_batch(batch)
            for doc, ids in zip(batch, encoded):
                if eos is not None:
                    ids = np.append(ids, eos)
                if not val.full:
                    val.write(ids)
                    docs["val"] += 1
                    val_doc_tokens += len(ids)
                    val_bytes += 0 if synthetic else len(doc.encode("utf-8"))
                else:
                    train.write(ids)
                    docs["train"] += 1
                if train.full:
                    break
            if train.full:
                break
    finally:
        val.close()
        train.close()
    if val.rows < val_rows or train.rows < 1:
        raise ValueError(f"data source {data['source']!r} has too few tokens: need {val_rows * row:,} for "
                         f"validation (val_tokens={val_tokens:,}) and at least one training row of {row}; "
                         f"got {val.rows * row:,} + {train.rows * row:,}")
    p = train.counts[train.counts > 0] / train.counts.sum()
    if synthetic:
        bytes_per_token = None  # token ids, not text: bits per byte does not apply
    elif tokenizer.byte_level:
        bytes_per_token = 1.0  # by definition: one token per byte (separators counted as bytes)
    else:
        bytes_per_token = val_bytes / val_doc_tokens
    return {"format_version": FORMAT_VERSION, "data": data, "tokenizer": tokenizer_fingerprint(data),
            "seq_len": seq_len, "val_tokens": val_tokens, "vocab_size": vocab, "dtype": dtype.name,
            "train_rows": train.rows, "val_rows": val.rows, "train_docs": docs["train"], "val_docs": docs["val"],
            "unigram_entropy": float(-(p * np.log(p)).sum()), "bytes_per_token": bytes_per_token}


def _check_positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
