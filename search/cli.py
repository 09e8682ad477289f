"""The ``loopscale`` command line.

Every subcommand is one ``add_<name>(subparsers)`` function that registers its parser and sets ``func``;
``main`` dispatches. Bad input (a ValueError from spec parsing or validation) is one line on stderr,
``loopscale: error: ...``, and exit code 2, raised before Ray starts or anything is written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from analysis.cli import register as add_analysis

from .spec import OBJECTIVES, PRESET_NAMES, SweepSpec

SPEC_HELP = f"a sweep spec TOML file, or a preset: {', '.join(PRESET_NAMES)}"


def add_plan(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan", help="show a sweep's cells, widths, tokens, FLOPs and estimated wall time (no training)",
        description="Show each (budget, r) cell's feasible widths with N_once, N_rec, D and tokens per parameter, "
                    "the total FLOPs, and a wall-time estimate from a throughput measured here in a few seconds.")
    p.add_argument("spec", help=SPEC_HELP)
    p.add_argument("--objective", choices=OBJECTIVES, help="override the spec's objective (simulate: no training)")
    p.set_defaults(func=_plan)


def _plan(args: argparse.Namespace) -> int:
    from .plan import measure_throughput, render_plan

    spec = SweepSpec.from_toml(args.spec, objective=args.objective)
    trains = spec.objective == "train" or spec.calibrate is not None
    print(render_plan(spec, measure_throughput(spec) if trains else None))
    return 0


def add_search(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "search", help="run (or resume) a sweep: Ray Tune trials steered by Optuna, logged to MLflow",
        description="Locate the compute-optimal width of every (FLOP budget, r) cell of the spec: an optional "
                    "learning-rate calibration, then one Optuna study per cell, all cells side by side in one "
                    "Ray Tune run; every trial is logged to MLflow (experiment = sweep name).")
    p.add_argument("spec", help=SPEC_HELP)
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted sweep: finished trials are kept, the rest run (a finished sweep "
                        "is a no-op)")
    p.add_argument("--objective", choices=OBJECTIVES,
                   help="override the spec's objective; simulate replays the sweep with the scaling law (and "
                        "skips calibration)")
    p.add_argument("--address", help="an existing Ray cluster to run on (default: RAY_ADDRESS, else local Ray)")
    p.add_argument("--tracking-uri", help="MLflow store: sqlite:///path/mlflow.db or http(s)://server "
                                          "(default: sqlite:///<cwd>/loopscale-runs/mlflow.db)")
    p.add_argument("--verbose", action="store_true", help="show Ray Tune's and Optuna's own logs")
    p.set_defaults(func=_search)


def _search(args: argparse.Namespace) -> int:
    from .tune_runner import run_search  # imports Ray: only when a sweep really runs

    spec = SweepSpec.from_toml(args.spec, objective=args.objective, address=args.address,
                               tracking_uri=args.tracking_uri)
    run_search(spec, resume=args.resume, verbose=args.verbose)
    return 0


# analyze, export and compare come from the analysis package
SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [add_plan, add_search, add_analysis]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loopscale",
        description="Find compute-optimal looped language models: sweep (FLOP budget, recurrences) cells with "
                    "Ray Tune + Optuna, log every trial to MLflow, and fit how much one recurrence is worth.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as exc:
        print(f"loopscale: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"loopscale: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
