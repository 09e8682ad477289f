"""The ``--precision`` option of ``loopscale plan``: its arguments checked before any work, then the forecast.

This module imports nothing slow at its top (the command line's parser reads ``DEFAULT_SIMS``); the forecast's
modules load when it runs.
"""

from __future__ import annotations

import argparse

# 16 copies: the forecast of the demo's design then takes 16 CPU-s (36 s wall on 2 cores shared at load 5); the
# median half-width's Monte Carlo error is about 10% of it and a power's at most 12 points (both printed)
DEFAULT_SIMS = 16
MAX_SIMS = 1000
DEFAULT_DELTA = 0.1


def check_precision_arguments(args: argparse.Namespace) -> None:
    """Every precision option's problem as one ValueError line, before anything loads or runs."""
    given = [name for name in ("pilot", "baseline", "baseline_phi", "delta", "target_half_width", "power",
                               "gpu_flops", "mfu", "tracking_uri") if getattr(args, name) is not None]
    if not args.precision:
        if given:
            raise ValueError(f"--{given[0].replace('_', '-')} is an option of the precision forecast: add --precision")
        return
    checks = [
        (1 < args.sims <= MAX_SIMS, f"--sims must be between 2 and {MAX_SIMS}, got {args.sims}"),
        (args.mfu is None or 0 < args.mfu <= 1, f"--mfu must be in (0, 1], got {args.mfu}"),
        (args.gpu_flops is None or args.gpu_flops > 0, f"--gpu-flops must be a positive FLOP/s, got {args.gpu_flops}"),
        (args.baseline is None or args.baseline_phi is None, "--baseline and --baseline-phi exclude each other"),
        (args.delta is None or args.delta != 0,
         "--delta must not be 0 (the power to tell 0 from 0 is the test's size)"),
        (args.power is None or 0 < args.power < 1, f"--power must be in (0, 1), got {args.power}"),
        (args.target_half_width is None or args.target_half_width > 0,
         f"--target-half-width must be > 0, got {args.target_half_width}"),
        (args.target_half_width is None or args.power is None, "--target-half-width and --power exclude each other"),
        (args.baseline_phi is None or -3 <= args.baseline_phi <= 3,
         f"--baseline-phi must be within the fit's bounds on phi, -3 to 3, got {args.baseline_phi}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


def run_precision(args: argparse.Namespace) -> int:
    from loopscale.analysis.options import FitOptions

    from ..plan.flops import MFU, PEAK_FLOPS
    from ..plan.walltime import cpus
    from ..spec import SweepSpec
    from .forecast import Target, cheapest, forecast
    from .inputs import baseline_of, setting_of
    from .render import render_precision

    def make(extra: tuple[str, ...]) -> SweepSpec:
        return SweepSpec.from_toml(args.spec, [*args.sets, *extra], objective=args.objective)

    spec = make(())
    options = FitOptions()
    setting = setting_of(spec, args.pilot, args.tracking_uri, args.sims, spec.concurrency("search", cpus()), options)
    wants_delta = args.baseline is not None or args.baseline_phi is not None or args.power is not None
    delta = args.delta if args.delta is not None else (DEFAULT_DELTA if wants_delta else None)
    baseline = baseline_of(setting, args.baseline, args.baseline_phi, args.tracking_uri) if delta is not None else None
    own = forecast(spec, setting, baseline, delta)
    target = search = None
    if args.target_half_width is not None or args.power is not None:
        target = Target(half_width=args.target_half_width, delta=delta, power=args.power)
        search = cheapest(spec, make, setting, own, target, baseline)
    mfu = MFU if args.mfu is None else args.mfu
    peak = PEAK_FLOPS if args.gpu_flops is None else args.gpu_flops
    print(render_precision(spec, setting, own, baseline=baseline, delta=delta, mfu=mfu, peak=peak, target=target,
                           search=search))
    return 0
