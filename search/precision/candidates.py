"""The designs the cheapest-design search tries: the spec's own; its budget ladder scaled up (every budget, and
a training spec's fixed warmdown branch budgets, times a factor) and extended by one rung above (the next budget
at the ladder's top ratio) or below (at its bottom ratio); its trials per cell times 2 and 4 (with the law
sampler, which stops a cell once its optimum is located, ``information = 1`` so that a cell takes more widths
while they pay for phi); and its r set with the middle r's left out or the next divisor of the shared depth added.
Each is the spec with ``--set`` items, so it is validated like the spec itself.

Why below as well as above: under a law with A N^-alpha small at large N, the loss differences between r's that
measure phi shrink as the budgets grow, while the noise in nats does not; a cheaper rung can buy more of phi.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from loopscale.model import iso_depth_template

from ..spec import SweepSpec

SCALES = (1, 2, 4)  # budget ladder factors
TRIALS = (2, 4)  # trials per cell, times the spec's


@dataclass(frozen=True)
class Candidate:
    label: str
    sets: tuple[str, ...]


def _toml(values) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


def candidates(spec: SweepSpec) -> list[Candidate]:
    """Every variant of ``spec`` the search tries, the spec itself first."""
    budgets = sorted(spec.grid.budgets)
    fixed = spec.training.recipe.get("branch_budgets", []) if spec.objective == "train" else []
    ladders = []
    for scale in SCALES:
        scaled, branch = [b * scale for b in budgets], [b * scale for b in fixed]
        name = f"budgets x{scale}" if scale > 1 else ""
        ladders.append((name, scaled, branch))
        if len(scaled) > 1:  # a fixed branch list of all budgets but the top (the demo's) keeps that shape
            top, bottom = scaled[-1] ** 2 / scaled[-2], scaled[0] ** 2 / scaled[1]
            ladders.append((", ".join(p for p in (name, "+1 rung above") if p), scaled + [top],
                            branch + ([scaled[-1]] if fixed else [])))
            ladders.append((", ".join(p for p in (name, "+1 rung below") if p), [bottom] + scaled,
                            ([bottom] if fixed else []) + branch))
    own = spec.sampling.trials_per_cell
    trials = [(own, ()), *((k * own, ("information=1",) if spec.sampling.sampler == "law" else ()) for k in TRIALS)]
    out = []
    for ladder, values, branch in ladders:
        for n, more in trials:
            for r_label, r_set in r_sets(spec):
                parts = [p for p in (ladder, f"{n} trials/cell" if n != own else "", r_label) if p]
                sets = [f"budgets={_toml(values)}", f"trials_per_cell={n}", f"recurrences={_toml(r_set)}", *more]
                if fixed:
                    sets.append(f"recipe.branch_budgets={_toml(branch)}")
                out.append(Candidate(", ".join(parts) or "the spec as it is", tuple(sets)))
    return out


def r_sets(spec: SweepSpec) -> list[tuple[str, tuple[int, ...]]]:
    """(label, r set): the spec's; its smallest and largest r alone; with the next divisor of the shared depth."""
    own = tuple(sorted(spec.grid.recurrences))
    out = [("", own)]
    if len(own) > 2:
        out.append((f"r {own[0]},{own[-1]}", (own[0], own[-1])))
    template = iso_depth_template(spec.grid.model_template())
    shared = template["depth"] - template["prelude"] - template["coda"]
    more = [d for d in range(own[-1] + 1, shared + 1) if shared % d == 0]
    if more:
        out.append((f"+r {more[0]}", own + (more[0],)))
    return out


def buildable(make: Callable[[tuple[str, ...]], SweepSpec], candidate: Candidate) -> SweepSpec | None:
    """The candidate's spec, or None where the spec refuses it (a budget no width fits, ...)."""
    try:
        return make(candidate.sets)
    except ValueError:
        return None


def searched_range() -> str:
    """The searched range in words, for a search that found nothing."""
    return (f"budgets x{', x'.join(map(str, SCALES[1:]))} and a rung above or below, trials per cell "
            f"x{', x'.join(map(str, TRIALS))}, r sets")
