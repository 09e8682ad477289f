"""A spec's design as the runs it would produce, and simulated final-loss tables at those runs.

The design is what the spec's own sampler proposes: its cells' studies (``tune.studies.make_studies``) driven
through ``tune.cells.CellTrials`` exactly as a sweep drives them, without Ray, on ``slots`` simulated workers (a
trial lasting in proportion to its budget, so the cost-aware order and the law sampler's early stops act as in a
sweep), each trial simulated (``objectives.simulate``) under the forecast's law and noise. A training spec's
fixed warmdown branches (``[recipe] branch_budgets``) are recorded as its trials would record them. The law
sampler adapts to the losses it sees, so the design is one draw of it (the spec's seed); the forecast then holds
these runs fixed and redraws only their losses.

A copy's losses follow the simulated objective's own loss model: the law's loss at the run's N_once, N_rec and
D, moved by ``objectives.noise.Noise`` seeded by the copy (a branch point shares its trial's own noise).
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
from dataclasses import dataclass

import pandas as pd

from loopscale.analysis.runs import expand_branches
from loopscale.model import JointLaw
from loopscale.objectives import TrialConfig, simulate
from loopscale.objectives.noise import Noise

from ..spec import SweepSpec
from ..spec_parts import Simulation
from ..tune.cells import FINISHED, CellTrials
from ..tune.studies import make_studies

COPY_SEED = 10_000  # the first copy's noise seed: apart from the seeds sweeps use (0, 1, 2, ...)


@dataclass(frozen=True, eq=False)
class Design:
    """The runs a spec's sweep would make: one row per trial and per warmdown branch point (as ``analyze``
    reads them), and the FLOPs its trials spend (each trial's budget and its branches' warmdowns)."""

    runs: pd.DataFrame
    trials: int
    flops: float

    def copy(self, law: JointLaw, noise: Noise, index: int) -> pd.DataFrame:
        """The runs with ``val_loss`` drawn afresh: copy ``index``'s noise, the law's loss."""
        trial_budget = self.runs.set_index("run_id")["budget_flops"]
        losses = []
        for row in self.runs.itertuples():
            own = trial_budget[row.branch_of] if row.branch_of else row.budget_flops
            clean = law.loss(row.N_once, row.N_rec, int(row.r), row.tokens)
            losses.append(noise.observe(clean, seed=COPY_SEED + index, budget=row.budget_flops, r=int(row.r),
                                        width=int(row.width), run_budget=own))
        return self.runs.assign(val_loss=losses)


def simulated_spec(spec: SweepSpec, law: JointLaw, noise: Noise) -> SweepSpec:
    """``spec`` with its search trials simulated under ``law`` and ``noise`` (which draws each trial's noise on its
    own, as a trained sweep's ``seeds = "per_trial"`` would: the simulated trials share the sweep's seed)."""
    return dataclasses.replace(spec, objective="simulate", sampling=dataclasses.replace(spec.sampling, seeds="shared"),
                               simulation=Simulation(noise=noise.noise, law=law.to_dict(),
                                                     cell_noise=noise.cell_noise, misspec=noise.misspec))


def design_of(spec: SweepSpec, law: JointLaw, noise: Noise, slots: int) -> Design:
    """The runs ``spec``'s search stage would make under ``law`` and ``noise`` on ``slots`` workers."""
    fixed = spec.training.recipe.get("branch_budgets", []) if spec.objective == "train" else []
    simulated = simulated_spec(spec, law, noise)
    logging.getLogger("optuna").setLevel(logging.WARNING)  # a line per study created, else (Optuna's own logger)
    trials = CellTrials(make_studies(simulated, "search", None), rounds=spec.sampling.rounds)
    clock, running, rows, n = 0.0, [], [], 0
    while True:
        while len(running) < slots:
            config = trials.suggest(str(n))
            if config is None or config == FINISHED:
                break
            heapq.heappush(running, (clock + config["trial"]["budget_flops"], n, config))
            n += 1
        if not running:
            break
        clock, trial_id, config = heapq.heappop(running)
        trial = TrialConfig.from_params(config["trial"])
        below = {float(b) for b in fixed if b < trial.budget_flops}
        trial = dataclasses.replace(trial, branch_budgets=tuple(sorted(below | set(trial.branch_budgets))))
        result = {**simulate(trial), "stage": "search", "seed": trial.seed}
        trials.on_trial_complete(str(trial_id), result)
        rows.append(result)
    table = pd.DataFrame(rows).assign(run_id=[str(i) for i in range(len(rows))], branch_of="")
    return Design(runs=expand_branches(table), trials=len(rows), flops=float(table["flops_spent"].sum()))
