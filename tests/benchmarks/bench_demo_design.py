"""Which 15-minute CPU demo can state phi? Candidate designs simulated under a toy-scale law, fitted like the demo.

    python tests/benchmarks/bench_demo_design.py                 # 20 seeds per design
    python tests/benchmarks/bench_demo_design.py --seeds 40 --noise 0.03

Toy law (demo template: effective depth 8 = 2 + 4 + 2, heads of 4, sequence 128, byte vocabulary, batch 4,096
tokens): L = E + A N_eff^-alpha + B D^-beta fitted (phi held at the paper's 0.46, the truth the simulated fits
must recover) to 11 real r = 1 points measured here: widths 8, 16, 32, 64 trained to C = 1e12 with Muon 0.04 and
the wsd schedule, each with warmdown branches at 1e11 and 3e11 (points under 20 optimizer steps left out):

    C = 1e12: d 8 1.945, d 16 1.705, d 32 1.895, d 64 2.159 nats;  3e11: 2.083, 2.064, 2.218, 2.315;
    1e11: 2.231, 2.271, 2.390 (d 64: 7 steps, left out)

giving E = 0.377, A = 14.78, alpha = 0.414, B = 7.356, beta = 0.119 (R^2 0.90, RMSE 0.061 nats: these toy
models scatter by ~0.05 nats between neighbouring widths). The optima sit at d ~ 8 (1e11), ~12 (3e11), ~16 (1e12).

Noise: ``objectives.noise.Noise`` (independent per trial, per-cell offset, smooth misspecification in width)
at demo scale: ``--noise`` per trial (default 0.03 nats; the demo's trials share data order and init seed,
common random numbers) with half of it per cell and as misspecification (RMSE ~0.04 in all; the toy fit's
0.061 includes the law's own misfit). Measured since (tests/benchmarks/bench_demo_noise.py): 0.005-0.007 nats
per trial at fixed data order, so ``--noise 0.006`` is the realistic setting; what the toy law cannot show is
the real models' departure from the law itself (a loss plateau at the lowest budgets, search/presets/demo.toml).
A branch at a width its cell also trained is left out, as analysis.runs marks it a repeat.

Designs: per cell, the widths a bracketing sampler lands on (multiples around the law's optimal width, rounded
to buildable widths; the real sampler does not know the law, so this flatters every design alike), trained at
the cell's budget; ``branches``: every trial also branches warmdowns at all smaller budgets (objectives/training.py),
adding points to the lower cells for ~20% of those budgets' FLOPs. Cost = sum of budgets (+ warmdown FLOPs).
Wall: ``loopscale plan``'s model of the whole ``loopscale demo`` (search/plan.py: its stages replayed over the
trial slots, Ray's and each stage's start, the analysis) for the demo preset with the design's budgets, head
width, trials per cell and branches, priced at the widths plan expects the sampler to try (near each cell's
first guess up to its narrowest: the range). A step is priced at the fp32 matmul peak of one trial's threads,
measured in this run (objectives.peak): a floor, since a small model's step also pays work that does not grow
with its FLOPs; ``--probe`` times each design's real step instead (plan's probe, a few seconds per design).
Reported per design: FLOPs, wall, share of cells with an interior IsoFLOP optimum, phi's median, the share of
95% intervals inside (0, 1), coverage of the truth, median interval width.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import tomllib  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from loopscale.analysis import fit_joint_law  # noqa: E402
from loopscale.analysis.isoflop import cell_optima  # noqa: E402
from loopscale.model import JointLaw, LoopedConfig, count_params, flops_per_token  # noqa: E402
from loopscale.objectives import TrialConfig, simulate  # noqa: E402
from loopscale.objectives.peak import device_peak_flops  # noqa: E402
from loopscale.search.spec import SweepSpec, resolve_spec_path  # noqa: E402

TOY_LAW = JointLaw(E=0.377, A=14.78, alpha=0.414, B=7.356, beta=0.119, phi=0.46)
BATCH = 4096
WARMDOWN = 0.2


@dataclass(frozen=True)
class Design:
    name: str
    budgets: tuple[float, ...]
    head_dim: int
    factors: tuple[float, ...]   # widths per cell: the optimal width times these
    branches: bool = False
    recurrences: tuple[int, ...] = (1, 2, 4)

    @property
    def template(self) -> dict:
        return dict(depth=8, prelude=2, coda=2, width_unit=self.head_dim, head_dim=self.head_dim, seq_len=128,
                    vocab_size=256, injection="linear")


DESIGNS = (
    Design("earlier demo: 3e11-1.2e12 (4x), heads of 8, 4/cell", (3e11, 6e11, 1.2e12), 8, (0.5, 0.75, 1.3, 1.8)),
    Design("30x: 6e10-1.8e12, heads of 4, 3/cell", (6e10, 2e11, 6e11, 1.8e12), 4, (0.6, 1.0, 1.6)),
    Design("30x 6e10-1.8e12, heads of 4, 3/cell + branches", (6e10, 2e11, 6e11, 1.8e12), 4,
           (0.6, 1.0, 1.6), True),
    Design("10x: 1.8e11-1.8e12, heads of 4, 4/cell + branches", (1.8e11, 6e11, 1.8e12), 4, (0.5, 0.8, 1.25, 2.0),
           True),
    Design("9x: 2e11-1.8e12, heads of 8, 3/cell + branches", (2e11, 6e11, 1.8e12), 8, (0.6, 1.0, 1.6), True),
    Design("9x 1.5e11-1.35e12, heads of 8, 3/cell + br.", (1.5e11, 4.5e11, 1.35e12), 8, (0.6, 1.0, 1.6), True),
    Design("shipped: 4.5x 3e11-1.35e12, heads of 8, 3/cell + br.", (3e11, 6.5e11, 1.35e12), 8, (0.6, 1.0, 1.6),
           True),
)


def sizes(s: float, r: int, template: dict) -> tuple[float, float, float]:
    config = LoopedConfig.iso_depth(s, r, **template)
    p = count_params(config)
    return p.N_once, p.N_rec, float(flops_per_token(config))


def cell_widths(design: Design, budget: float, r: int) -> list[int]:
    """Buildable width multipliers s around the law's optimal width of the cell (at least 20 steps each)."""
    unit = design.head_dim
    grid = np.arange(1, 64)
    feasible = [s for s in grid if budget / sizes(s, r, design.template)[2] >= 20 * BATCH]
    losses = [TOY_LAW.loss(*sizes(s, r, design.template)[:2], r, budget / sizes(s, r, design.template)[2])
              for s in feasible]
    best = feasible[int(np.argmin(losses))]
    chosen = sorted({int(min(max(round(best * f), 1), feasible[-1])) for f in design.factors})
    return [s for s in chosen if s * unit >= unit]


def trials(design: Design) -> list[dict]:
    """(budget, r, s) of the trials and, with branches, the smaller budgets each one branches to."""
    out = []
    for budget in design.budgets:
        for r in design.recurrences:
            lower = [c for c in design.budgets if c < budget] if design.branches else []
            out += [{"budget": budget, "r": r, "s": s, "branches": lower} for s in cell_widths(design, budget, r)]
    return out


def simulated_runs(design: Design, seed: int, noise: float, cell_noise: float | None = None,
                   misspec: float | None = None) -> pd.DataFrame:
    """Each trial and its branches; a branch at a (budget, r, width) already in the table is left out, as
    analysis.runs marks it a repeat (common random numbers make it the same run). ``cell_noise`` and ``misspec``
    default to half of ``noise`` each."""
    cell_noise = noise / 2 if cell_noise is None else cell_noise
    misspec = noise / 2 if misspec is None else misspec
    rows, seen = [], set()
    for t in trials(design):
        for budget in [t["budget"], *t["branches"]]:
            if (budget, t["r"], t["s"]) in seen:
                continue
            seen.add((budget, t["r"], t["s"]))
            config = {"budget_flops": budget, "r": t["r"], "s": float(t["s"]), "template": design.template,
                      "batch_tokens": BATCH, "seed": seed, "objective": "simulate", "law": TOY_LAW.to_dict(),
                      "noise": noise, "cell_noise": cell_noise, "misspec": misspec}
            m = simulate(TrialConfig(**config))
            if m["steps"] >= 20:
                rows.append({"stage": "search", **{k: v for k, v in m.items() if k != "reason"}, "reason": ""})
    return pd.DataFrame(rows)


def cost(design: Design) -> tuple[float, int]:
    """(FLOPs, trials): budgets plus the branches' warmdowns (WARMDOWN of each branch's tokens)."""
    flops = sum(t["budget"] + WARMDOWN * sum(t["branches"]) for t in trials(design))
    return flops, len(trials(design))


def demo_spec(design: Design) -> SweepSpec:
    """The demo preset with the design's budgets, recurrences, head width, trials per cell and branches (every
    trial warms down at each smaller budget of the design)."""
    raw = tomllib.loads(resolve_spec_path("demo").read_text(encoding="utf-8"))
    raw.update(name="demo-design", budgets=list(design.budgets), recurrences=list(design.recurrences),
               trials_per_cell=len(design.factors))
    raw["template"].update(width_unit=design.head_dim, head_dim=design.head_dim, injection="linear")
    raw["recipe"]["branch_budgets"] = list(design.budgets[:-1]) if design.branches else []
    return SweepSpec.from_dict(raw)


def wall_minutes(design: Design, probe: bool) -> tuple[float, float]:
    """(low, high) minutes of ``loopscale demo`` with this design under plan's model: steps at one trial's
    measured fp32 matmul peak, or timed by plan's probe."""
    # (imported here: the designs and their simulated runs serve other benchmarks without plan's wall-time model)
    from loopscale.search.plan import Throughput, estimate, measure_throughput, side_by_side

    spec = demo_spec(design)
    if probe:
        throughput = measure_throughput(spec)
    else:
        threads = torch.get_num_threads()
        torch.set_num_threads(max(1, int(spec.placement.cpus_per_trial)))
        try:
            peak = device_peak_flops(torch.device("cpu"))
        finally:
            torch.set_num_threads(threads)
        throughput = Throughput(flops_per_s=peak, step_s=0.0, shape="fp32 matmul peak", device="cpu",
                                side_by_side=side_by_side(spec))
    low, high = sorted(estimate(spec, throughput).total_s)  # at peak FLOP/s the narrowest widths need not cost more
    return low / 60, high / 60


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--noise", type=float, default=0.03, help="per-trial noise, nats")
    parser.add_argument("--probe", action="store_true",
                        help="time each design's trial step (plan's probe) instead of pricing it at the matmul peak")
    parser.add_argument("--starts", type=int, default=200)
    parser.add_argument("--bootstrap", type=int, default=100)
    parser.add_argument("--designs", default="", help="comma-separated indices into DESIGNS (default: all)")
    args = parser.parse_args()
    designs = [DESIGNS[int(i)] for i in args.designs.split(",")] if args.designs else DESIGNS
    truth = TOY_LAW.phi
    pricing = ("each design's step timed by plan's probe" if args.probe else
               "steps at one trial's fp32 matmul peak, measured now (a floor)")
    print(f"toy law {TOY_LAW}; noise {args.noise} nats per trial (+{args.noise / 2} per cell, "
          f"+{args.noise / 2} misspecification); {args.seeds} seeds; wall: plan's model, {pricing}")
    print(f"{'design':<48} {'FLOPs':>8} {'trials':>6} {'wall min':>9} {'interior':>8} {'phi med':>7} "
          f"{'CI in (0,1)':>11} {'coverage':>8} {'CI width':>8}")
    for design in designs:
        flops, n_trials = cost(design)
        low, high = wall_minutes(design, args.probe)
        stats = []
        for seed in range(args.seeds):
            runs = simulated_runs(design, seed, args.noise)
            optima = cell_optima(runs, n_bootstrap=0).table
            fit = fit_joint_law(runs, n_starts=args.starts, n_bootstrap=args.bootstrap, seed=seed)
            lo, hi = fit.phi_ci
            stats.append({"interior": (optima["status"] == "ok").mean(), "phi": fit.phi, "inside": 0 < lo and hi < 1,
                          "covered": lo <= truth <= hi, "width": hi - lo})
        s = pd.DataFrame(stats)
        print(f"{design.name:<48} {flops:>8.2e} {n_trials:>6} {f'{low:.1f}-{high:.1f}':>9} "
              f"{100 * s['interior'].mean():>7.0f}% "
              f"{s['phi'].median():>7.3f} {100 * s['inside'].mean():>10.0f}% {100 * s['covered'].mean():>7.0f}% "
              f"{s['width'].median():>8.3f}", flush=True)


if __name__ == "__main__":
    main()
