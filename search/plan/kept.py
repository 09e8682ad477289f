"""What keeping trained models costs (``[resources] keep_models``, search/tune/keep.py): the bytes MLflow will hold.

A kept model's file is its trained state dict in fp32 (training keeps fp32 weights; bf16 autocast only casts the
matmuls), every parameter once, embedding and LM head included, plus the trial config and the file format's few
kilobytes: ``KEPT_BYTES_PER_PARAM`` x (N + N_embed) of its width. Which width a trial ends up with is the search's
choice, so the plan gives the range from each cell's narrowest width to its widest; "best" keeps one model per
cell (of both stages), "all" one per trial that ends "ok" (at most the planned trials).
"""

from __future__ import annotations

from loopscale.model import account

from ..spec import STAGES, SweepSpec

KEPT_BYTES_PER_PARAM = 4  # fp32


def kept_bytes_range(spec: SweepSpec) -> tuple[int, int, int]:
    """(models kept at most, fewest bytes, most bytes) under the spec's ``keep_models``; (0, 0, 0) when nothing is
    trained or kept."""
    mode = spec.placement.keep_models
    if spec.objective != "train" or mode == "none":
        return 0, 0, 0
    models, low, high = 0, 0, 0
    for stage in STAGES:
        for cell in spec.cells(stage):
            kept = 1 if mode == "best" else cell.n_trials
            sizes = [_model_bytes(spec, cell.r, s) for s in (cell.widths[0], cell.widths[-1])]
            models, low, high = models + kept, low + kept * min(sizes), high + kept * max(sizes)
    return models, low, high


def _model_bytes(spec: SweepSpec, r: int, s: float) -> int:
    counts = account(spec.grid.model(s, r))
    return KEPT_BYTES_PER_PARAM * (counts.N + counts.N_embed)
