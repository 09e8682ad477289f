"""A kept model as an lm-evaluation-harness model (PyPI ``lm-eval``, an optional install: ``pip install lm-eval``),
so the harness' standard benchmarks run on a sweep's models at any r.

From Python::

    import lm_eval
    from loopscale.search.harness.lm_eval_model import LoopscaleLM
    lm_eval.simple_evaluate(model=LoopscaleLM(run="RUN_ID", r=4), tasks=["lambada_openai"])

or the harness' own command line, with this module registering the model first::

    python -m loopscale.search.harness.lm_eval_model run --model loopscale --model_args run=RUN_ID,r=4 --tasks ...

``run`` is the trial run holding the kept model (``loopscale.load_model``), ``r`` the recurrence count to evaluate
at (default: as trained), ``tracking_uri`` its store; ``device`` and ``batch_size`` as the harness passes them.
The three requests: ``loglikelihood`` scores a continuation's tokens after its context (both encoded with the
trial's tokenizer, after its document separator; a sequence longer than the model's context keeps its last
``seq_len`` tokens), returning their summed log-probability and whether greedy decoding reproduces them;
``loglikelihood_rolling`` sums a text's log-probability in consecutive windows of ``seq_len`` tokens, each window
read after the previous one's last token only; ``generate_until`` decodes greedily until a stop string or
``max_gen_toks`` tokens.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from loopscale.model import runtime
from loopscale.objectives.tasks.tokens import trial_codec

from ..models import KeptModel, load_model

DEFAULT_BATCH = 16
DEFAULT_GEN_TOKENS = 256


@register_model("loopscale")
class LoopscaleLM(LM):
    """The kept model of ``run`` (or ``kept``, one already loaded) at ``r`` recurrences, answering the harness'
    requests (module docstring); keyword arguments the harness passes and it does not use are ignored."""

    def __init__(self, run: str | None = None, r: int | None = None, tracking_uri: str | None = None,
                 device: str | None = "cpu", batch_size: int | str | None = DEFAULT_BATCH,
                 kept: KeptModel | None = None, **_: Any):
        super().__init__()
        if kept is None:
            if not run:
                raise ValueError("the loopscale model needs model_args run=RUN_ID (a trial run with a kept model)")
            kept = load_model(str(run), tracking_uri)
        self.kept, self.r = kept, int(r) if r is not None else kept.trial.r
        self.target = runtime.pick_device(device or "cpu")
        if self.target.type == "cuda" and not torch.cuda.is_available():  # the harness' default device
            raise ValueError("loopscale: no CUDA device here; pass --device cpu")
        self.module = kept.at(self.r).to(self.target)
        self.codec = trial_codec(kept.trial)
        self.seq_len = kept.config.seq_len
        self.batch = int(batch_size) if str(batch_size or "").isdigit() else DEFAULT_BATCH

    def _head(self) -> list[int]:
        return [] if self.codec.separator is None else [self.codec.separator]

    @torch.no_grad()
    def _scores(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(summed log-probability, greedy) of each (context tokens, continuation tokens)."""
        out = []
        for first in range(0, len(pairs), self.batch):
            chunk = pairs[first:first + self.batch]
            rows = [(ctx + cont)[-(self.seq_len + 1):] for ctx, cont in chunk]
            idx = torch.zeros(len(rows), max(len(r) - 1 for r in rows), dtype=torch.long)
            for i, row in enumerate(rows):
                idx[i, :len(row) - 1] = torch.tensor(row[:-1])
            logp = F.log_softmax(self.module(idx.to(self.target)).float(), dim=-1)
            for i, ((_, cont), row) in enumerate(zip(chunk, rows)):
                n = len(cont)
                targets = torch.tensor(row[-n:], device=logp.device)
                predicted = logp[i, len(row) - 1 - n:len(row) - 1]
                out.append((float(predicted.gather(1, targets[:, None]).sum()),
                            bool((predicted.argmax(-1) == targets).all())))
        return out

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [(self._head() + self.codec.encode(ctx), self.codec.encode(cont)) for ctx, cont in
                 (req.args for req in requests)]
        if any(not ctx or not cont for ctx, cont in pairs):
            raise ValueError("loopscale: a request with no context token or an empty continuation cannot be scored")
        return self._scores(pairs)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        totals = []
        for req in requests:
            tokens = self._head() + self.codec.encode(req.args[0])
            windows = [([tokens[start - 1]], tokens[start:start + self.seq_len])
                       for start in range(1, len(tokens), self.seq_len)]
            totals.append(sum(score for score, _ in self._scores(windows)))
        return totals

    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for req in requests:
            context, kwargs = req.args
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            tokens = self._head() + self.codec.encode(context)
            generated: list[int] = []
            text = ""
            for _ in range(int(kwargs.get("max_gen_toks", DEFAULT_GEN_TOKENS))):
                window = torch.tensor([(tokens + generated)[-self.seq_len:]], device=self.target)
                generated.append(int(self.module(window)[0, -1].argmax()))
                text = self.codec.decode(generated)
                if any(stop in text for stop in until):
                    break
            for stop in until:
                text = text.split(stop)[0]
            out.append(text)
        return out


if __name__ == "__main__":
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()
