"""The analysis subcommands of ``loopscale``: analyze, export, predict, compare.

``register(subparsers)`` adds them to the main parser (search/cli.py); each sets ``func`` to a function of the
parsed arguments returning an exit code. Bad input raises ValueError with one line, before anything is
written; ``main`` (and the top-level CLI) prints it and exits 2. ``python -m analysis.cli`` runs them alone.

Registering the commands loads nothing heavier than numpy and pandas: each command imports the fit, the plots
and the allocation when it runs, so the parser of every ``loopscale`` command loads neither scipy nor
matplotlib.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from . import constraints, numbers
from .options import (DATA_MODES, DEFAULT_FIT_OPTIONS, INTERVAL_METHODS, MAX_BOOTSTRAP, MAX_RUNS, MAX_STARTS,
                      FitOptions)
from .store import DEFAULT_RUN_DIR, print_error
from .tables import FORMATS

DEFAULT_OUT = Path(DEFAULT_RUN_DIR) / "analysis"


def register(subparsers) -> None:
    """Add ``analyze``, ``export``, ``predict`` and ``compare`` to an argparse subparsers object."""
    analyze_p = subparsers.add_parser(
        "analyze", help="fit a sweep: per-cell optima, frontier, the joint law with phi, tables and plots",
        description="Read a sweep's runs from MLflow (or a CSV/parquet runs table), find each (budget, r) cell's "
                    "IsoFLOP optimum and the Pareto frontier, fit the joint law L = E + A N_eff^-alpha + "
                    "B D^-beta with N_eff = N_once + r^phi N_rec (plus phi = 0, phi = 1 and per-r fits), and "
                    "write the tables (CSV, Markdown, LaTeX, JSON) and plots (PNG). When read from MLflow, the "
                    "output is also logged as the artifacts of an 'analysis' run in the sweep's experiment, "
                    "replacing the previous one.")
    analyze_p.add_argument("--experiment", required=True,
                           help="MLflow experiment (= sweep name), or the path of a runs table (.csv/.parquet)")
    _tracking_argument(analyze_p)
    analyze_p.add_argument("--out", type=Path, default=None,
                           help=f"output folder, replaced as a whole: new, empty or an earlier analysis's "
                                f"(default: {DEFAULT_OUT}/<experiment>)")
    analyze_p.add_argument("--budgets", type=_floats, default=None,
                           help="budgets of the allocation table, comma-separated (default: the sweep's)")
    analyze_p.add_argument("--r", type=_ints, default=None, dest="recurrences",
                           help="recurrence counts of the allocation table, comma-separated (default: the sweep's)")
    analyze_p.add_argument("--no-log", action="store_true", help="do not log the results to MLflow")
    _baseline_argument(analyze_p)
    _fit_arguments(analyze_p, fix_phi=True)
    analyze_p.set_defaults(func=run_analyze)

    export_p = subparsers.add_parser(
        "export", help="write the compute-optimal allocation table for chosen budgets and r",
        description="Compute-optimal width, N, N_eff, tokens, tokens per parameter, predicted loss, gap to r = 1 "
                    "and the equivalent non-looped model, for each budget and r, under a sweep's fitted law or "
                    "the paper's published one. Writes to --out or standard output.")
    _law_source(export_p)
    export_p.add_argument("--budgets", type=_floats, default=None,
                          help="FLOP budgets, comma-separated, e.g. 1e18,1e19 (default: the sweep's, or the "
                               "paper's six)")
    export_p.add_argument("--r", type=_ints, default=None, dest="recurrences",
                          help="recurrence counts, comma-separated (default: the sweep's, or 1,2,4,8)")
    export_p.add_argument("--format", choices=list(FORMATS), default="csv", help="table format (default csv)")
    export_p.add_argument("--full", action="store_true",
                          help="every column (continuous optimum, N_once/N_rec, N_eff, gap to r=1, equivalent "
                               "non-looped model, ...); default: the buildable model per budget and r (budget, "
                               "r, width, heads, N, D, D/N, loss)")
    export_p.add_argument("--out", type=Path, default=None, help="output file (default: standard output)")
    export_p.add_argument("--plot", type=Path, default=None, metavar="FILE",
                          help="also draw loss against N (unique non-embedding parameters) at each budget, one curve "
                               "per r, to FILE (.png, .svg or .pdf)")
    constraints.add_arguments(export_p)
    _fit_arguments(export_p, fix_phi=True)
    export_p.set_defaults(func=run_export)

    predict_p = subparsers.add_parser(
        "predict", help="the loss of a run at a budget and r, the compute-optimal N and D there, with intervals",
        description="What loss will a run reach at budget C and recurrence r, at which compute-optimal N and D, "
                    "with what interval: under a sweep's fitted law (intervals from its bootstrap draws) or the "
                    "published one (which carries no interval but phi's). With --width, also the loss of that "
                    "width's model trained for the whole steps the budget buys.")
    _law_source(predict_p)
    predict_p.add_argument("--budget", type=_positive, required=True, help="training FLOPs, e.g. 1e20")
    predict_p.add_argument("--r", type=_ints_one, required=True, help="recurrence count")
    predict_p.add_argument("--width", type=_ints_one, default=None,
                           help="also the loss of the model of this width (a multiple of head_dim)")
    constraints.add_arguments(predict_p)
    _fit_arguments(predict_p, fix_phi=True)
    predict_p.set_defaults(func=run_predict)

    compare_p = subparsers.add_parser(
        "compare", help="Delta-phi between two sweeps as one model, with its interval, matched cells and a verdict",
        description="Fit two sweeps (e.g. a new injection or truncated backprop against the baseline) jointly with "
                    "one base law and phi_B = phi_A + Delta-phi, and report Delta-phi with its profile interval "
                    "and the F test of Delta-phi = 0; beside it each sweep's own fit and verdict, and per matched "
                    "(budget, r) cell the difference of the optimal losses. A sweep without r = 1 runs borrows the "
                    "other's when the templates are equal; both are restricted to their common budgets unless "
                    "--all-budgets.")
    compare_p.add_argument("experiment_a", help="baseline sweep: MLflow experiment or runs table file")
    compare_p.add_argument("experiment_b", help="sweep to compare: MLflow experiment or runs table file")
    _tracking_argument(compare_p)
    compare_p.add_argument("--all-budgets", action="store_true",
                           help="fit each sweep on all its budgets, not only the shared ones")
    _fit_arguments(compare_p)
    compare_p.set_defaults(func=run_compare)


def _law_source(parser: argparse.ArgumentParser) -> None:
    """--experiment (fit a sweep) or --law paper (the published constants), and --tracking-uri."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--experiment", help="fit this MLflow experiment (or runs table file) and use its law")
    source.add_argument("--law", choices=["paper"], help="use the published constants (Schwethelm et al. 2026)")
    _tracking_argument(parser)
    _baseline_argument(parser)


def _baseline_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline", default=None, metavar="EXPERIMENT",
                        help="a sweep (MLflow experiment or runs table file) whose r = 1 runs this sweep borrows "
                             "when it has none, as compare does: only from an equal template")


def _tracking_argument(parser: argparse.ArgumentParser) -> None:
    """--tracking-uri, and --columns: where the runs come from and how their columns read."""
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow tracking URI, sqlite:///path/mlflow.db or http(s)://server "
                             "(default: $MLFLOW_TRACKING_URI, else the search's sqlite:///<cwd>/loopscale-runs/"
                             "mlflow.db)")
    parser.add_argument("--columns", default=None, metavar="TARGET=SOURCE[*FACTOR],...",
                        help="read the runs table's column SOURCE as the format's column TARGET, times FACTOR "
                             "for a unit, e.g. val_loss=loss,N_once=params,budget_flops=gflops*1e9 "
                             "(docs/runs_table.md)")


def _fit_arguments(parser: argparse.ArgumentParser, *, fix_phi: bool = False) -> None:
    group = parser.add_argument_group("fit")
    if fix_phi:
        group.add_argument("--fix-phi", type=float, default=None, metavar="VALUE",
                           help="hold phi at VALUE (0: a recurrence adds no capacity, 1: one is worth a unique "
                                "block); default: fit it, or with runs of a single r the plain law without phi")
    group.add_argument("--data", choices=DATA_MODES, default="all",
                       help="fit all runs, only the per-r Pareto frontier, or the per-cell optima (default all)")
    group.add_argument("--stage", default="search",
                       help="fit only runs of this stage; 'all' for every stage (default search)")
    group.add_argument("--n-starts", type=int, default=500,
                       help=f"most optimiser starts: the best local minima of the projected exponent grid "
                            f"(default 500, at most {MAX_STARTS:,}; a fit finds a few)")
    group.add_argument("--n-bootstrap", type=int, default=200,
                       help=f"bootstrap resamples behind the intervals (default 200, at most "
                            f"{MAX_BOOTSTRAP:,}: memory grows with resamples x runs; a runs table holds at most "
                            f"{MAX_RUNS:,} runs, the paper's 116)")
    group.add_argument("--interval", choices=INTERVAL_METHODS, default="auto",
                       help="block bootstrap over (budget, r) cells, residual bootstrap, or auto: block when "
                            "resamples keep three r's and budgets, residual otherwise (see analysis/bootstrap.py; "
                            "default auto)")
    group.add_argument("--seed", type=int, default=0, help="seed of the starts and the bootstrap (default 0)")


def _options(args: argparse.Namespace) -> FitOptions:
    return FitOptions(data=args.data, stage=None if args.stage == "all" else args.stage, n_starts=args.n_starts,
                      n_bootstrap=args.n_bootstrap, seed=args.seed, interval=args.interval,
                      fix_phi=getattr(args, "fix_phi", None))


def run_analyze(args: argparse.Namespace) -> int:
    options = _options(args)  # first: bounds and choices refused before any work
    analyze_experiment(args.experiment, args.tracking_uri, out=args.out, options=options,
                       budgets=args.budgets, recurrences=args.recurrences, log=not args.no_log, columns=args.columns,
                       baseline=args.baseline)
    return 0


def analyze_experiment(experiment: str, tracking_uri: str | None = None, *, out: Path | None = None,
                       options: FitOptions = DEFAULT_FIT_OPTIONS, budgets: list[float] | None = None,
                       recurrences: list[int] | None = None, log: bool = True, columns: str | None = None,
                       baseline: str | None = None) -> Path:
    """``loopscale analyze``: fit ``experiment`` (an MLflow experiment or a runs file, its columns mapped by
    ``columns``; with the r = 1 runs of ``baseline`` where it lends them), write its tables and plots to ``out``
    (returned; default ``DEFAULT_OUT/<name>``), print the summary, and log an analysis run when the runs came
    from MLflow and ``log``."""
    from .report import analyze
    from .runs import usable_runs

    _check_out(out, folder=True)
    runs = _with_baseline(_load(experiment, tracking_uri, columns), baseline, tracking_uri, options)
    name = Path(experiment).stem if runs.attrs.get("tracking_uri") is None else experiment
    out = out or DEFAULT_OUT / name
    _check_out(out, folder=True)
    unfinished = ""
    if runs.attrs.get("tracking_uri") is not None:
        from .unfinished import unfinished_note

        unfinished = unfinished_note(experiment, runs.attrs["tracking_uri"])
        if unfinished:
            print(f"loopscale: warning: {unfinished}", file=sys.stderr, flush=True)
    used = usable_runs(runs, stage=options.stage)
    if budgets:
        warn_extrapolation(budgets, used["budget_flops"])
    if recurrences:
        warn_recurrences(recurrences, used["r"])
    progress = Progress()
    result = analyze(runs, name=name, options=options, budgets=budgets, recurrences=recurrences,
                     progress=progress)
    result.unfinished = unfinished
    if runs.attrs.get("tracking_uri") is not None:
        from .tracking import read_sweep_calibration

        result.calibration = read_sweep_calibration(experiment, runs.attrs["tracking_uri"])
    progress(f"writing tables and plots to {out}")
    written = result.write(out)
    print(result.summary_text())
    print(f"wrote {len(written)} files to {out}")
    if runs.attrs.get("tracking_uri") is not None and log:
        from .tracking import log_analysis

        metrics, params, tags = result.mlflow_record()
        run_id, replaced = log_analysis(experiment, runs.attrs["tracking_uri"], out, metrics=metrics,
                                        params=params, tags=tags)
        print(f"logged to MLflow run {run_id} of experiment {experiment!r}"
              + (f" (replaced {len(replaced)} earlier analysis run(s))" if replaced else ""))
    return out


def _load(experiment: str, tracking_uri: str | None, columns: str | None):
    """``load_runs`` (``columns``: --columns), and a warning line on stderr for runs whose tokens disagree with
    their budgets (refused when all do: ``runs.budget_disagreement``)."""
    from .runs import budget_disagreement, load_runs

    runs = load_runs(experiment, tracking_uri, columns=columns)
    disagreement = budget_disagreement(runs, experiment)
    if disagreement:
        say(f"loopscale: warning: {disagreement}", file=sys.stderr)
    return runs


def _with_baseline(runs, baseline: str | None, tracking_uri: str | None, options: FitOptions):
    """``runs`` with ``baseline``'s r = 1 runs borrowed (``borrow.with_borrowed_r1``, as compare borrows), and a
    line on stderr saying what was borrowed or why nothing was; ``runs`` itself without a baseline."""
    if baseline is None:
        return runs
    from .borrow import with_borrowed_r1

    attrs = dict(runs.attrs)
    runs, note = with_borrowed_r1(runs, _load(baseline, tracking_uri, None), options.stage)
    runs.attrs.update(attrs)
    print(f"loopscale: {note} (baseline {baseline})", file=sys.stderr, flush=True)
    return runs


class Progress:
    """Progress lines on stderr, each with the seconds since the analysis started (stdout stays the report)."""

    def __init__(self) -> None:
        self.started = time.perf_counter()

    def __call__(self, line: str) -> None:
        print(f"[{time.perf_counter() - self.started:5.1f} s] {line}", file=sys.stderr, flush=True)


ANALYSIS_ENTRIES = {"tables", "plots", "summary.json", "summary.txt"}  # what Analysis.write puts in a folder


def _check_out(out: Path | None, *, folder: bool) -> None:
    """--out must be able to become what the command writes (a folder, or a file), checked before any work.
    analyze replaces its folder as a whole, so an existing one must be empty or an earlier analysis: anything
    else in it would be deleted."""
    if out is None or not out.exists():
        return
    if folder and not out.is_dir():
        raise ValueError(f"--out {out} is a file; analyze writes a folder of tables and plots: name a folder")
    if not folder and out.is_dir():
        raise ValueError(f"--out {out} is a folder; export writes one table: name a file")
    if folder:
        others = sorted(p.name for p in out.iterdir() if p.name not in ANALYSIS_ENTRIES)
        if others or (any(out.iterdir()) and not (out / "summary.json").is_file()):
            raise ValueError(f"--out {out} holds {', '.join(others[:3]) or 'files'}"
                             f"{' ...' if len(others) > 3 else ''}, not an earlier analysis; analyze replaces "
                             "that folder as a whole: name a new folder or an earlier analysis's")


def run_export(args: argparse.Namespace) -> int:
    from . import constrained
    from .intervals import spread_of
    from .law_optimum import optimum_table, short_table
    from .tables import render

    _check_out(args.out, folder=False)
    _check_plot(args.plot)
    options = _options(args)
    args.constraints = constraints.from_args(args)
    law, template, batch_tokens, budgets, recurrences, costs = law_for(args, options, args.budgets,
                                                                       args.recurrences)
    if costs is not None and args.plot is not None:
        raise ValueError("--plot draws the buildable models of a template, and none builds the runs' models")
    extra = {"batch_tokens": batch_tokens} if batch_tokens else {}
    spread, note = spread_of(law)
    if costs is None:
        table = constrained.allocation_under(law, budgets, recurrences, args.constraints, spread, template=template,
                                             **extra)
    else:
        table = optimum_table(law, budgets, recurrences, costs=costs, spread=spread)
    print(f"intervals: {note}", file=sys.stderr)
    say(args.constraints.text(template), file=sys.stderr)
    if args.plot is not None:
        from .capacity_plot import capacity_figure

        args.plot.parent.mkdir(parents=True, exist_ok=True)
        capacity_figure(law, table, template=template, max_params=args.max_params,
                        **extra).savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}", file=sys.stderr)
    if not args.full:
        table = short_table(table) if costs is not None else constrained.short_table(table, args.constraints)
        if args.format in ("md", "latex"):
            table = constrained.readable_table(table)
    text = render(table, args.format)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {len(table)} rows to {args.out}")
    return 0


def _check_plot(plot: Path | None) -> None:
    """--plot names a file of a format the figure is saved in, checked before any work."""
    from .plots import FORMATS

    if plot is not None and (plot.is_dir() or plot.suffix.lstrip(".") not in FORMATS):
        raise ValueError(f"--plot {plot} must name a .png, .svg or .pdf file")


def law_for(args: argparse.Namespace, options: FitOptions, budgets: list[float] | None,
            recurrences: list[int] | None):
    """The law export and predict use, with what sizes its models: (LawFit or the published JointLaw, template,
    batch_tokens or None for the paper's, budgets, recurrences, costs), ``budgets`` and ``recurrences`` where
    given, else the sweep's (the paper's for --law paper). ``costs`` is None where the template builds the runs'
    models, else their ``law_optimum.RunCosts``: no template sizes them, and the law's own compute-optimal N and
    D answer, a line on stderr says so. Each (budget, r) and ``args.width`` (predict's) are checked before any
    fit (``predict.check_requests``), and a sweep of a single r answers for another r only under a phi given by
    --fix-phi: its fit holds phi at 0, an assumption no output line would state. Fitting a sweep prints its fit
    on stderr; budgets outside those fitted get a warning."""
    from loopscale.model import PAPER_LAW

    from .compare import excluded_text
    from .fit import fit_joint_law
    from .flops import PAPER_GRID, PAPER_RECURRENCES
    from .identify import judged, likely_fixes, status_label
    from .isoflop import cell_optima
    from .law_optimum import RunCosts
    from .predict import check_requests
    from .runs import template_of, usable_runs
    from .sizes import PAPER_BATCH_TOKENS, template_mismatch
    from .suite import judged_with_restrictions

    width = getattr(args, "width", None)
    if args.law == "paper":
        if args.columns is not None:
            raise ValueError("--columns maps the columns of a runs table; --law paper reads none")
        if args.baseline is not None:
            raise ValueError("--baseline lends r = 1 runs to a fit of a sweep; --law paper fits none")
        if options.fix_phi is not None:
            raise ValueError("--fix-phi holds phi in a fit of a sweep; --law paper is the published law, phi 0.459")
        check_requests(budgets or list(PAPER_GRID), recurrences or list(PAPER_RECURRENCES), width, None,
                       PAPER_BATCH_TOKENS, getattr(args, "constraints", None))
        if budgets:
            warn_extrapolation(budgets, list(PAPER_GRID))
        if recurrences:
            warn_recurrences(recurrences, PAPER_RECURRENCES)
        return PAPER_LAW, None, None, budgets or list(PAPER_GRID), recurrences or list(PAPER_RECURRENCES), None
    runs = _with_baseline(_load(args.experiment, args.tracking_uri, args.columns), args.baseline, args.tracking_uri,
                          options)
    used = usable_runs(runs, stage=options.stage)
    template, batch_tokens, _ = template_of(runs)
    mismatch = template_mismatch(used, template)
    costs = RunCosts.of(used) if mismatch else None
    given = budgets
    budgets = budgets or sorted(used["budget_flops"].unique())
    measured = sorted(int(r) for r in used["r"].unique())
    recurrences = recurrences or measured
    others = [r for r in recurrences if r not in measured]
    if len(measured) == 1 and others and options.fix_phi is None:  # the fit would hold phi at 0 (fit.py)
        raise ValueError(f"{args.experiment} has runs of one r only (r={measured[0]}): at r={others[0]} phi is not "
                         "measured; pass --fix-phi VALUE to say which phi (0: a recurrence adds no capacity)")
    if costs is None:
        check_requests(budgets, recurrences, width, template, batch_tokens, getattr(args, "constraints", None))
    else:
        costs.check(recurrences)
        if width is not None:
            raise ValueError(f"--width needs a template that builds the runs' models, and none does for "
                             f"{args.experiment} ({mismatch})")
        if getattr(args, "constraints", None) not in (None, constraints.Constraints()):
            raise ValueError(f"a cap or serving cost (--max-params, --max-memory, --inference-tokens) needs a "
                             f"template that builds the runs' models, and none does for {args.experiment} "
                             f"({mismatch})")
    law = fit_joint_law(runs, options=options)
    if law.phi_applicable and law.fixed_phi is None:
        law, _, _ = judged_with_restrictions(law, runs, options)
    else:  # no phi to judge (one r, or phi held): the verdict line says so
        law = judged(law, runs, options)
    say(f"{args.experiment}: fitted {law.n_runs} runs {status_label(law, options.bounds)}; excluded "
          f"{excluded_text(runs, options.stage)}\n  {law.phi_text()}\n  verdict: {law.verdict}", file=sys.stderr)
    fixes = likely_fixes(cell_optima(used, stage=None, n_bootstrap=0).table) if law.warnings else []
    for line in [f"warning: {w}" for w in law.warnings] + [f"  likely fix: {f}" for f in fixes]:
        say(line, file=sys.stderr)
    if given:
        warn_extrapolation(budgets, used["budget_flops"])
    warn_recurrences(recurrences, measured)
    if any(r > 1 for r in recurrences):  # the outputs compare with r = 1 (gap to r = 1, where r beats it)
        warn_r1(measured)
    if costs is not None:
        say(f"no template sizes the runs of {args.experiment} ({mismatch}): the law's compute-optimal N and D "
            f"under {costs.note}", file=sys.stderr)
    return law, template, batch_tokens, budgets, recurrences, costs


def run_predict(args: argparse.Namespace) -> int:
    from .predict import predict, prediction_lines
    from .sizes import PAPER_BATCH_TOKENS

    options = _options(args)
    args.constraints = constraints.from_args(args)
    law, template, batch_tokens, _, _, costs = law_for(args, options, [args.budget], [args.r])
    batch_tokens = batch_tokens or PAPER_BATCH_TOKENS
    result = predict(law, args.budget, args.r, width=args.width, template=template, batch_tokens=batch_tokens,
                     costs=costs, constraints=args.constraints)
    if result["constrained"]:
        say(args.constraints.text(template), file=sys.stderr)
    print("\n".join(prediction_lines(result, batch_tokens)))
    return 0


def say(text: str, file=None) -> None:
    """Print ``text`` (to stdout, or ``file``) with every line within ``numbers.COLUMNS``: a sweep's path or a
    list of warnings in it can make a line of any length."""
    print(numbers.wrap(text), file=file or sys.stdout, flush=True)


def warn_extrapolation(budgets, fitted_budgets) -> None:
    """A warning line on stderr for budgets outside the fitted range: the law is extrapolated there."""
    from .allocation import outside_fitted

    outside = outside_fitted(budgets, fitted_budgets)
    if outside:
        print(f"loopscale: warning: budget(s) {', '.join(numbers.flops(c) for c in outside)} outside the "
              f"fitted budgets {numbers.flops(min(fitted_budgets))} to {numbers.flops(max(fitted_budgets))} FLOPs: "
              "the law is extrapolated there", file=sys.stderr)


def warn_recurrences(recurrences, fitted_recurrences) -> None:
    """A warning line on stderr for each r the law was not fitted on: beyond the fitted r's the law is
    extrapolated (phi's r^phi is measured nowhere there), between them interpolated."""
    fitted = sorted({int(r) for r in fitted_recurrences})
    for r in sorted({int(r) for r in recurrences} - set(fitted)):
        where = "extrapolated" if not fitted[0] <= r <= fitted[-1] else "interpolated between the fitted r's"
        print(f"loopscale: warning: r={r} was not run (the law was fitted on r = {', '.join(map(str, fitted))}): "
              f"the law is {where} there", file=sys.stderr)


def warn_r1(fitted_recurrences) -> None:
    """A warning line on stderr when r = 1 was not run: the comparisons with r = 1 are extrapolated
    (``allocation.r1_not_run``)."""
    from .allocation import r1_not_run

    warning = r1_not_run(fitted_recurrences)
    if warning:
        say(f"loopscale: warning: {warning}", file=sys.stderr)


def run_compare(args: argparse.Namespace) -> int:
    from .compare import compare_runs

    options = _options(args)
    runs_a = _load(args.experiment_a, args.tracking_uri, args.columns)
    runs_b = _load(args.experiment_b, args.tracking_uri, args.columns)
    result = compare_runs(runs_a, runs_b, name_a=args.experiment_a, name_b=args.experiment_b, options=options,
                          all_budgets=args.all_budgets)
    result = dataclasses.replace(result, spec_notes=tuple(spec_notes(args.experiment_a, runs_a, args.experiment_b,
                                                                     runs_b)))
    print(result.text())
    return 0


def spec_notes(name_a: str, runs_a, name_b: str, runs_b) -> list[str]:
    """The spec keys that differ between two sweeps read from MLflow, and warnings for those that cannot act."""
    from .spec_diff import differences_text, inert_differences, spec_differences
    from .tracking import read_sweep_spec

    uris = (runs_a.attrs.get("tracking_uri"), runs_b.attrs.get("tracking_uri"))
    if None in uris:
        return ["spec keys: not compared (a runs table file carries no spec)"]
    specs = (read_sweep_spec(name_a, uris[0]), read_sweep_spec(name_b, uris[1]))
    if None in specs:
        return ["spec keys: not compared (a sweep has no logged spec.toml)"]
    differences = spec_differences(*specs)
    objectives = [spec.get("objective", "train") for spec in specs]
    return differences_text(differences, name_a, name_b) + [f"warning: {w}" for w in
                                                            inert_differences(differences, *objectives)]


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return values


def _positive(text: str) -> float:
    values = _floats(text)
    if len(values) != 1 or values[0] == float("inf"):
        raise argparse.ArgumentTypeError(f"expected one finite positive number, got {text!r}")
    return values[0]


def _ints_one(text: str) -> int:
    values = _ints(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"expected one positive integer, got {text!r}")
    return values[0]


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    """The analysis subcommands on their own (the full CLI is ``loopscale``)."""
    parser = argparse.ArgumentParser(prog="loopscale", description="loopscale analysis commands")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as err:
        return print_error(str(err), 2)


if __name__ == "__main__":
    sys.exit(main())
