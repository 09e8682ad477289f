"""``loopscale predict``: the loss a run will reach at a budget C and recurrence r, the compute-optimal N and D
there, and (with a width) the loss of that width's model at that budget, each with its interval.

The point values come from ``allocation.allocation_table`` (the compute-optimal continuous model and the
buildable one next to it); a given width trains for the whole optimizer steps its budget buys
(``model.tokens_for_budget``) and its loss is the law's at its sizes (``sizes.SizeCurve``). The intervals come
from ``intervals.spread_of``: a fit's bootstrap draws, or for the published law phi's interval alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from loopscale.model import JointLaw, tokens_for_budget

from . import numbers
from .constrained import allocation_under, loop_wins_text
from .constraints import Constraints, check
from .fit_types import LawFit
from .intervals import LawSpread, spread_of
from .law_optimum import RunCosts, optimum_table
from .sizes import PAPER_BATCH_TOKENS, SizeCurve


def check_requests(budgets: list[float], recurrences: list[int], width: int | None,
                   template: dict[str, Any] | None, batch_tokens: int, constraints: Constraints | None = None) -> None:
    """A ValueError with one line when a (budget, r) cannot be answered: an r the template cannot loop, a width
    that is not buildable, a budget that buys no optimizer step (for the width, or for any width), or
    ``constraints`` that no model of an r fits (``constrained.check``)."""
    for r in recurrences:
        curve = SizeCurve.from_model(r, template)
        if width is not None and width % curve.head_dim:
            raise ValueError(f"--width {width} is not buildable: widths are multiples of head_dim {curve.head_dim}")
        for budget in budgets:
            if tokens_for_budget(curve.config(width or curve.head_dim), budget, batch_tokens) == 0:
                where = f"width {width}" if width else f"any buildable width (the narrowest is {curve.head_dim})"
                raise ValueError(f"budget {numbers.flops(budget)} FLOPs buys no optimizer step of {batch_tokens} "
                                 f"tokens at r={r} and {where}; use a larger budget")
    if constraints is not None:
        check(constraints, recurrences, template)


def predict(law: LawFit | JointLaw, budget: float, r: int, *, width: int | None = None,
            template: dict[str, Any] | None = None, batch_tokens: int = PAPER_BATCH_TOKENS,
            costs: RunCosts | None = None, constraints: Constraints | None = None) -> dict[str, Any]:
    """The compute-optimal model at (``budget``, ``r``) (the ``allocation_table`` row with its ``_lo``/``_hi``
    intervals; its buildable model the best under ``constraints``, with their columns: analysis/constrained.py),
    plus for ``width`` (``asked_width``): ``width_tokens``, ``width_N`` and ``width_loss`` with
    ``width_loss_lo``/``_hi``; ``note``, where the intervals come from; ``constrained``, whether any constraint or
    serving was asked. With ``costs`` (runs no template builds) the row of ``law_optimum.optimum_table`` instead,
    with no width and no constraint."""
    constraints = constraints or Constraints()
    spread, note = spread_of(law)
    if costs is not None:
        if width is not None:
            raise ValueError("a width needs a template that builds the runs' models")
        if constraints != Constraints():
            raise ValueError("a cap or serving cost needs a template that builds the runs' models")
        row = optimum_table(law, [budget], [r], costs=costs, spread=spread).iloc[0].to_dict()
        return {**row, "note": note, "constrained": False}
    check_requests([budget], [r], width, template, batch_tokens, constraints)
    row = allocation_under(law, [budget], [r], constraints, spread, template=template,
                           batch_tokens=batch_tokens).iloc[0].to_dict()
    row["note"], row["constrained"] = note, constraints != Constraints()
    if width is not None:
        row.update(_at_width(law if isinstance(law, JointLaw) else law.law, spread, budget, r, width, template,
                             batch_tokens))
    return row


def _at_width(law: JointLaw, spread: LawSpread | None, budget: float, r: int, width: int,
              template: dict[str, Any] | None, batch_tokens: int) -> dict[str, float]:
    curve = SizeCurve.from_model(r, template)
    tokens = tokens_for_budget(curve.config(width), budget, batch_tokens)
    sizes = curve.sizes(width)
    out = {"asked_width": width, "width_tokens": tokens, "width_N": float(sizes["N"]),
           "width_loss": float(law.loss(sizes["N_once"], sizes["N_rec"], r, tokens)),
           "width_loss_lo": np.nan, "width_loss_hi": np.nan}
    if spread is not None:
        losses = spread.laws.loss(sizes["N_once"], sizes["N_rec"], r, tokens)[:, 0]
        out["width_loss_lo"], out["width_loss_hi"] = map(float, spread.bounds(losses))
    return out


def prediction_lines(p: dict[str, Any], batch_tokens: int) -> list[str]:
    """The prediction as lines of at most 120 columns, every number through analysis/numbers.py."""
    def with_range(value: float, column: str, form) -> str:
        span = numbers.span(p[f"{column}_lo"], p[f"{column}_hi"], form)
        return form(value) + (f" ({span})" if span and span != form(value) else "")

    lines = [f"budget {numbers.flops(p['budget_flops'])} FLOPs, r={int(p['r'])}; intervals: {p['note']}",
             f"compute-optimal: N {with_range(p['N'], 'N', numbers.count)}, D "
             f"{with_range(p['tokens'], 'tokens', numbers.count)} tokens, loss "
             f"{with_range(p['loss'], 'loss', numbers.loss)} nats"]
    if "flops_per_param_token" in p:  # a law optimum (law_optimum.py): what it took a FLOP to cost
        lines.append(f"cost: C = k N D with k = {numbers.sig(p['flops_per_param_token'])} FLOPs per token and "
                     "parameter; no template builds these runs, so no width is given")
    if np.isfinite(p.get("width_built", np.nan)):  # a law optimum without a template builds no model
        lines.append(f"buildable: width {int(p['width_built'])} ({numbers.plural(int(p['heads_built']), 'head')}), N "
                     f"{with_range(p['N_built'], 'N_built', numbers.count)}, D "
                     f"{with_range(p['tokens_built'], 'tokens_built', numbers.count)} tokens, loss "
                     f"{with_range(p['loss_built'], 'loss_built', numbers.loss)} nats")
    if p["constrained"]:
        lines.append(f"{'capped' if p['capped'] else 'not capped'}; to serve: {numbers.count(p['memory_bytes'])} "
                     f"bytes (weights {numbers.count(p['weight_bytes'])}, KV cache {numbers.count(p['kv_bytes'])}), "
                     f"{numbers.flops(p['forward_flops_per_token'])} FLOPs per token; training "
                     f"{numbers.flops(p['flops_built'])} FLOPs, serving {numbers.flops(p['serving_flops'])}, "
                     f"lifetime {numbers.flops(p['lifetime_flops'])}")
    if int(p["r"]) > 1 and "loop_wins_below_N" in p:  # (a law optimum without a template has no buildable cap)
        lines.append(f"r={int(p['r'])} " + loop_wins_text(p["loop_wins_below_N"], p["loop_wins_below_N_lo"],
                                                         p["loop_wins_below_N_hi"]))
    if "width_loss" in p:
        lines.append(f"width {p['asked_width']}: N {numbers.count(p['width_N'])}, D {numbers.count(p['width_tokens'])} "
                     f"tokens (whole steps of {numbers.count(batch_tokens)}), loss "
                     f"{with_range(p['width_loss'], 'width_loss', numbers.loss)} nats")
    return [part for line in lines for part in _wrap(line)]


def _wrap(line: str, width: int = 120) -> list[str]:
    """A line cut at '; ' or ', ' into pieces of at most ``width`` columns, the later ones indented."""
    pieces: list[str] = []
    while len(line) > width:
        cut = max(line.rfind("; ", 0, width), line.rfind(", ", 0, width))
        if cut <= 0:
            break
        pieces.append(line[:cut + 1])
        line = "  " + line[cut + 2:]
    return pieces + [line]
