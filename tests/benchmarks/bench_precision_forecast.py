"""The precision forecast (``loopscale plan SPEC --precision``) against the sweeps it forecasts (run on demand;
prints figures, asserts nothing).

    python tests/benchmarks/bench_precision_forecast.py [SPEC] [--sweeps 24] [--sims 24] [--set KEY=VALUE ...]

SPEC (default ``smoke``) simulated under its ``[simulate]`` law and noise. The forecast holds one design (the
sampler's proposals at the spec's seed) and redraws its losses; a sweep re-runs the sampler at each seed, so its
design adapts to its own losses, as ``loopscale search`` does (the same studies and ``CellTrials``, no Ray). Each
sweep is fitted as ``analyze`` fits. Printed for both: the median and 80% range of phi's 95% profile half-width,
the share of intervals excluding phi = 0 and phi = 1, their trials and FLOPs; and the ratio of the medians.
Quality figures: not timing-sensitive (the wall time of each part is printed for scale).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from loopscale.analysis.options import FitOptions
from loopscale.analysis.precision import forecast_phi
from loopscale.search import SweepSpec
from loopscale.search.precision.design import design_of
from loopscale.search.precision.forecast import forecast
from loopscale.search.precision.inputs import setting_of


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", default="smoke")
    parser.add_argument("--sweeps", type=int, default=24, help="simulated sweeps, seeds 1..N")
    parser.add_argument("--sims", type=int, default=24, help="the forecast's copies")
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], dest="sets")
    args = parser.parse_args()
    spec = SweepSpec.from_toml(args.spec, args.sets, objective="simulate")
    setting = setting_of(spec, None, None, args.sims, args.slots, FitOptions())
    begin = time.perf_counter()
    own = forecast(spec, setting)
    forecast_s = time.perf_counter() - begin
    begin = time.perf_counter()
    designs = [design_of(dataclasses.replace(spec, sampling=dataclasses.replace(spec.sampling, seed=seed)),
                         setting.law, setting.noise, args.slots) for seed in range(1, args.sweeps + 1)]
    swept = forecast_phi((d.runs for d in designs), setting.options)
    sweeps_s = time.perf_counter() - begin
    print(f"{args.spec} {' '.join(args.sets)}: law {setting.law}, noise {setting.noise}")
    print(f"{'':>26} {'n':>4} {'median hw':>10} {'80% range':>15} {'excl. 0':>8} {'excl. 1':>8} {'trials':>7} "
          f"{'FLOPs':>9} {'wall':>6}")
    rows = (("forecast (one design)", own.phi, own.design.trials, own.design.flops, forecast_s),
            ("sweeps (own designs)", swept, sum(d.trials for d in designs) / len(designs),
             sum(d.flops for d in designs) / len(designs), sweeps_s))
    for label, f, trials, flops, wall in rows:
        lo, hi = f.range80
        print(f"{label:>26} {f.n:>4} {f.median:>10.4f} {f'{lo:.4f}-{hi:.4f}':>15} {f.power('phi = 0'):>8.0%} "
              f"{f.power('phi = 1'):>8.0%} {trials:>7.1f} {flops:>9.3g} {wall:>5.0f}s")
    print(f"median half-width, forecast / sweeps: {own.phi.median / swept.median:.2f} "
          f"(Monte Carlo errors +-{own.phi.median_error:.4f} and +-{swept.median_error:.4f})")


if __name__ == "__main__":
    main()
