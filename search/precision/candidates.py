"""The designs the cheapest-design search tries: the spec's own, its budget ladder scaled up (every budget, and
a training spec's fixed warmdown branch budgets, times a factor) or extended by one rung (the next budget at the
ladder's top ratio), its trials per cell doubled, and its r set with the middle r's left out or the next divisor
of the shared depth added. Each is the spec with ``--set`` items, so it is validated like the spec itself."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from loopscale.model import iso_depth_template

from ..spec import SweepSpec

SCALES = (1, 2, 4, 8)  # budget ladder factors


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
        scaled = [b * scale for b in budgets]
        ladders.append((f"budgets x{scale}" if scale > 1 else "", scaled, [b * scale for b in fixed]))
        if len(scaled) > 1:  # one more rung at the top ratio; the old top becomes a fixed branch where others are
            top = scaled[-1] * scaled[-1] / scaled[-2]
            more = [b * scale for b in fixed] + ([scaled[-1]] if fixed else [])
            ladders.append(((f"budgets x{scale}, " if scale > 1 else "") + "+1 rung", scaled + [top], more))
    trials = [spec.sampling.trials_per_cell, 2 * spec.sampling.trials_per_cell]
    out = []
    for ladder, values, branch in ladders:
        for n in trials:
            for r_label, r_set in r_sets(spec):
                parts = [p for p in (ladder, f"{n} trials/cell" if n != trials[0] else "", r_label) if p]
                sets = [f"budgets={_toml(values)}", f"trials_per_cell={n}", f"recurrences={_toml(r_set)}"]
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
