"""A trained trial's tokenizer, as task scoring needs it: text -> token ids, and the document separator a prompt
starts with (objectives/tasks/scoring.py)."""

from __future__ import annotations

from collections.abc import Callable

from ..data.bpe import open_tokenizer
from ..data.cache import default_cache_dir
from ..data.spec import normalize_data
from ..trial import TrialConfig


def trial_tokenizer(trial: TrialConfig) -> tuple[Callable[[str], list[int]], int | None]:
    """(encode, separator id) of the data ``trial`` trained on; ValueError in one line for the synthetic source,
    whose token ids have no text."""
    data = normalize_data(trial.data)
    if data["source"] == "synthetic":
        raise ValueError("tasks are text: a model trained on the synthetic source (token ids) cannot read them")
    tokenizer = open_tokenizer(data, trial.cache_dir or default_cache_dir())
    return (lambda text: [int(t) for t in tokenizer.encode_batch([text])[0]]), tokenizer.eos_id
