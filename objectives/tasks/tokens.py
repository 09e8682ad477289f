"""A trained trial's tokenizer, as task scoring needs it: text -> token ids and back, and the document separator a
prompt starts with (objectives/tasks/scoring.py)."""

from __future__ import annotations

from dataclasses import dataclass

from ..data.bpe import open_tokenizer
from ..data.cache import default_cache_dir
from ..data.spec import normalize_data
from ..data.tokenizers import Tokenizer
from ..trial import TrialConfig


@dataclass(frozen=True)
class TextCodec:
    """``encode`` and ``decode`` with a trial's tokenizer, and its ``separator`` id (None: it has none)."""

    tokenizer: Tokenizer

    @property
    def separator(self) -> int | None:
        return self.tokenizer.eos_id

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode_batch([text])[0]]

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer.byte_level:
            return bytes(ids).decode("utf-8", errors="replace")
        return self.tokenizer.backend.decode(ids)


def trial_codec(trial: TrialConfig) -> TextCodec:
    """The codec of the data ``trial`` trained on; ValueError in one line for the synthetic source, whose token ids
    have no text."""
    data = normalize_data(trial.data)
    if data["source"] == "synthetic":
        raise ValueError("tasks are text: a model trained on the synthetic source (token ids) cannot read them")
    return TextCodec(open_tokenizer(data, trial.cache_dir or default_cache_dir()))
