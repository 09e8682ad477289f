"""Scoring a task on a language model, by the paper's rules (the DCLM CORE convention, nanochat's ``core_eval``).

Each prompt (objectives/tasks/prompts.py) is tokenised with the model's tokenizer, after its document separator
(the token every training document follows, so a prompt starts as a document does). The continuation's tokens
are those after the prompts' common token prefix (multiple_choice: the choices differ at the end), before their
common suffix (schema: the contexts differ, the continuation is shared), or after the prompt without it
(language_modeling). A sequence longer than the model's context keeps its last ``seq_len`` tokens. Then

    multiple_choice, schema   correct when the gold option has the lowest mean cross-entropy over its
                              continuation tokens, -1/|c| sum_{t in c} log p(x_t | x_<t)  (the first lowest on a tie)
    language_modeling         correct when greedy decoding reproduces the continuation: argmax_v p(v | x_<t) = x_t
                              at every continuation position t

and a task's accuracy is the share of its items scored correct; its centered accuracy
(acc - baseline) / (1 - baseline) puts chance at 0 and a perfect score at 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .bundle import Task
from .prompts import render

BATCH_SEQUENCES = 64


@dataclass(frozen=True)
class Scored:
    """One prompt's tokens and the half-open range [start, end) of its continuation tokens."""

    item: int
    tokens: tuple[int, ...]
    start: int
    end: int


def centered(accuracy: float, baseline: float) -> float:
    """(acc - baseline) / (1 - baseline): 0 at chance, 1 at a perfect score (module docstring)."""
    return (accuracy - baseline) / (1 - baseline)


def sequences(task: Task, encode: Callable[[str], list[int]], bos: int | None, seq_len: int) -> list[Scored]:
    """Every scored sequence of ``task`` in item order (module docstring), cropped to ``seq_len`` tokens."""
    out = []
    for index in range(len(task.items)):
        head = [] if bos is None else [bos]
        tokens = [head + list(encode(prompt)) for prompt in render(task, index)]
        if task.task_type == "language_modeling":
            without, with_ = tokens
            if with_[:len(without)] != without or len(with_) <= len(without):
                raise ValueError(f"task {task.label!r} item {index + 1}: the prompt without its continuation does "
                                 "not tokenise as a prefix of the prompt with it")
            spans = [(with_, len(without), len(with_))]
        elif task.task_type == "multiple_choice":
            start = _common(tokens, forward=True)
            spans = [(t, min(start, len(t) - 1), len(t)) for t in tokens]
        else:
            suffix = _common(tokens, forward=False)
            spans = [(t, len(t) - max(suffix, 1), len(t)) for t in tokens]
        for toks, start, end in spans:
            cut = max(0, len(toks) - seq_len)
            out.append(Scored(index, tuple(toks[cut:]), max(start - cut, 1), end - cut))
    return out


@torch.no_grad()
def score_task(model: torch.nn.Module, task: Task, encode: Callable[[str], list[int]], bos: int | None,
               seq_len: int, device: str | torch.device = "cpu") -> list[bool]:
    """Whether each item of ``task`` is scored correct by ``model`` (forward(idx) -> logits (B, T, V)), in item
    order (module docstring)."""
    seqs = sequences(task, encode, bos, seq_len)
    losses, greedy = continuation_scores(model, seqs, device)
    correct = []
    by_item: dict[int, list[int]] = {}
    for position, seq in enumerate(seqs):
        by_item.setdefault(seq.item, []).append(position)
    for index, positions in sorted(by_item.items()):
        if task.task_type == "language_modeling":
            correct.append(greedy[positions[0]])
        else:
            means = [losses[p] for p in positions]
            correct.append(means.index(min(means)) == task.items[index]["gold"])
    return correct


def continuation_scores(model: torch.nn.Module, seqs: Sequence[Scored],
                        device: str | torch.device = "cpu") -> tuple[list[float], list[bool]]:
    """Per sequence, the mean cross-entropy over its continuation and whether greedy decoding reproduces it."""
    losses, greedy = [], []
    for first in range(0, len(seqs), BATCH_SEQUENCES):
        batch = seqs[first:first + BATCH_SEQUENCES]
        width = max(len(s.tokens) for s in batch)
        idx = torch.zeros(len(batch), width, dtype=torch.long)  # right padding: a causal model never reads it
        for row, s in enumerate(batch):
            idx[row, :len(s.tokens)] = torch.tensor(s.tokens)
        logits = model(idx.to(device)).float()
        logp = F.log_softmax(logits, dim=-1)
        for row, s in enumerate(batch):
            targets = idx[row, s.start:s.end].to(logp.device)
            predicted = logp[row, s.start - 1:s.end - 1]
            losses.append(float(-predicted.gather(1, targets[:, None]).mean()))
            greedy.append(bool((predicted.argmax(-1) == targets).all()))
    return losses, greedy


def _common(tokens: list[list[int]], forward: bool) -> int:
    """The length of the prefix (``forward``) or suffix all token lists share."""
    shortest = min(len(t) for t in tokens)
    for i in range(shortest):
        position = i if forward else -1 - i
        if any(t[position] != tokens[0][position] for t in tokens):
            return i
    return shortest
