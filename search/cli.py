"""The ``loopscale`` command line.

Every subcommand is one ``add_<name>(subparsers)`` function that registers its parser and sets ``func``;
``main`` dispatches. Bad input (a ValueError from spec parsing or validation) is one line on stderr,
``loopscale: error: ...``, and exit code 2, raised before Ray starts or anything is written. A failing
store or disk, or a sweep left incomplete, is one line and exit code 1; a sweep stopped by SIGINT or SIGTERM
one line saying how to resume, and exit code 130 or 143. Every error line leaves through
``analysis.store.print_error``, which hides the password of any URI in it, whoever wrote the message.

A signal at any moment of a command is that one line and exit code, not a traceback: this module imports
nothing slow at its top, so ``main`` holds SIGTERM (SIGINT is Python's KeyboardInterrupt) before torch, MLflow
or Ray are imported (seconds), and the subcommands import what they need when they run.
"""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import sys
import threading
from collections.abc import Callable

from .stopping import SweepInterrupted, noted_interrupt, raise_if_interrupted, restore_signals, take_signals

STORE_HELP = "MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite:///<cwd>/loopscale-runs/mlflow.db)"


def _spec_argument(p: argparse.ArgumentParser) -> None:
    from .spec import PRESET_NAMES

    p.add_argument("spec", help=f"a sweep spec TOML file, or a preset: {', '.join(PRESET_NAMES)}")


def _objective_argument(p: argparse.ArgumentParser, help: str) -> None:
    from loopscale.objectives.trial import OBJECTIVES

    p.add_argument("--objective", choices=OBJECTIVES, help=help)


def add_plan(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan", help="show a sweep's cells, widths, tokens, FLOPs and estimated wall time (no training)",
        description="Show each (budget, r) cell's feasible widths with N_once, N_rec, D and tokens per parameter, "
                    "the total FLOPs, and a wall-time estimate from a throughput measured here in a few seconds.")
    _spec_argument(p)
    _objective_argument(p, "override the spec's objective (simulate: no training)")
    _set_argument(p)
    p.add_argument("--widths", action="store_true",
                   help="every cell's table of widths (N_once, N_rec, N, D, D/N, steps, learning rates) instead of "
                        "one line per cell")
    _precision_arguments(p)
    p.set_defaults(func=_plan)


def _precision_arguments(p: argparse.ArgumentParser) -> None:
    from .precision.command import DEFAULT_SIMS

    g = p.add_argument_group("precision forecast (--precision)")
    g.add_argument("--precision", action="store_true",
                   help="forecast phi's interval half-width and the power of its tests for this design by simulating "
                        "its final-loss table many times under a law and noise and fitting each as analyze does; "
                        "with its cost in FLOPs and GPU-hours (no training)")
    g.add_argument("--pilot", metavar="EXPERIMENT", help="the law and noise of a finished sweep's fit and residuals "
                                                          "(default: the spec's [simulate] law, else the paper's fit, "
                                                          "and its noise sizes)")
    g.add_argument("--baseline", metavar="EXPERIMENT", help="forecast Delta-phi against this finished sweep (its fit "
                                                             "the shared base law, its runs the baseline's design)")
    g.add_argument("--baseline-phi", type=float, metavar="PHI",
                   help="forecast Delta-phi against a baseline of this phi on the spec's design")
    g.add_argument("--delta", type=float, help="the Delta-phi whose interval and power to forecast (default 0.1 with "
                                               "a baseline or --power)")
    g.add_argument("--target-half-width", type=float, metavar="H",
                   help="search budgets, trials per cell and r sets for the cheapest design whose median half-width "
                        "of phi's interval is at most H")
    g.add_argument("--power", type=float, help="search for the cheapest design that tells --delta from 0 with this "
                                               "power (e.g. 0.8)")
    g.add_argument("--sims", type=int, default=DEFAULT_SIMS,
                   help=f"simulated copies per design (default {DEFAULT_SIMS})")
    g.add_argument("--gpu-flops", type=float, default=None, metavar="FLOP/S",
                   help="the GPU's peak FLOP/s for GPU-hours (default 989e12: an H100 SXM's dense bf16)")
    g.add_argument("--mfu", type=float, default=None, help="the model FLOPs utilisation for GPU-hours (default 0.4)")
    g.add_argument("--tracking-uri", help=STORE_HELP + " (for --pilot and --baseline)")


def _set_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                   help="change one spec key without editing the file, e.g. --set trials_per_cell=4 --set "
                        "widths.s_max=8 --set 'budgets=[1e12, 1e13]' (repeatable; dotted keys reach into "
                        "tables; values are TOML); validated like the file, and the effective spec is the one "
                        "hashed and logged")


def _plan(args: argparse.Namespace) -> int:
    from .plan.probe import measure_throughput
    from .plan.render import render_plan
    from .precision.command import check_precision_arguments, run_precision
    from .spec import SweepSpec

    check_precision_arguments(args)
    if args.precision:
        return run_precision(args)
    spec = SweepSpec.from_toml(args.spec, args.sets, objective=args.objective)
    if not spec.grid.model(spec.grid.s_min, spec.grid.recurrences[0]).builtin:  # a new architecture: its contract first
        from .check_arch import check_architecture

        if _problems(check_architecture(spec)[1]):
            return 2
    trains = spec.objective == "train" or spec.training.calibrate is not None
    print(render_plan(spec, measure_throughput(spec) if trains else None, widths=args.widths))
    return 0


def add_check_arch(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "check-arch", help="check the spec's architecture: measured counts and FLOPs, init loss, gradients, a few "
                           "training steps (CPU; about a second per shape measured, the first time)",
        description="Per r, the measured N_once, N_rec, N_embed and FLOPs per token at the narrowest and widest "
                    "width; then on CPU: the loss at init against log V, gradients reaching every parameter, the "
                    "same loss twice for the same seed, and a few steps of the spec's recipe lowering the loss and "
                    "moving every parameter. Each problem is one line, exit 2. Reading the spec measures every "
                    "width its cells may train (about a second of CPU per (width, r) shape), once: the counts are "
                    "cached under the spec's cache_dir.")
    _spec_argument(p)
    _set_argument(p)
    p.set_defaults(func=_check_arch)


def _check_arch(args: argparse.Namespace) -> int:
    from .check_arch import check_architecture
    from .spec import SweepSpec

    report, problems = check_architecture(SweepSpec.from_toml(args.spec, args.sets))
    print("\n".join(report))
    return _problems(problems)


def _problems(problems: list[str]) -> int:
    """Each problem one ``loopscale: error:`` line; 2 when there is any."""
    for problem in problems:
        print(f"loopscale: error: {problem}", file=sys.stderr)
    return 2 if problems else 0


def add_tokenizer(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "tokenizer", help="train (or find cached) the byte-level BPE a spec asks for with tokenizer = \"bpe\"",
        description="Train the spec's byte-level BPE (its [template] vocabulary size) on the spec's data source "
                    "with Hugging Face tokenizers and cache it beside the packed data, fingerprinted by the data "
                    "source and the training settings; `loopscale search` does the same on its own. For a "
                    "tokenizer file or hub id, load it and show its vocabulary.")
    _spec_argument(p)
    p.set_defaults(func=_tokenizer)


def _tokenizer(args: argparse.Namespace) -> int:
    from loopscale import objectives

    from .spec import SweepSpec

    spec = SweepSpec.from_toml(args.spec)
    if spec.objective == "simulate" and spec.training.calibrate is None:
        raise ValueError(f"{spec.name}: objective 'simulate' trains no model, so it needs no tokenizer (it reads "
                         "only the vocabulary its data's tokenizer has)")
    data = spec.training.data
    name = data.get("tokenizer", "bytes")
    if name != "bpe":
        vocab = objectives.vocab_size_of(data)
        print(f"tokenizer {name!r}: {vocab:,} tokens; nothing to train (tokenizer = \"bpe\" trains one)")
        return 0
    trained = objectives.train_bpe(data, spec.placement.cache_dir)
    how = f"trained in {trained.seconds:.1f} s" if trained.seconds else "cached"
    print(f"byte-level BPE, {trained.vocab_size:,} tokens (asked for {data['tokenizer_vocab']:,}), {how}, on "
          f"{trained.train_chars:,} characters of data source {data.get('source', 'kjv')!r}: {trained.path}")
    return 0


def add_search(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "search", help="run (or resume) a sweep: Ray Tune trials steered by Optuna, logged to MLflow",
        description="Locate the compute-optimal width of every (FLOP budget, r) cell of the spec: an optional "
                    "learning-rate calibration, then one Optuna study per cell, all cells side by side in one "
                    "Ray Tune run; every trial is logged to MLflow (experiment = sweep name).")
    _spec_argument(p)
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted sweep: finished trials are kept, the rest run (a finished sweep "
                        "is a no-op, unless its MLflow store lost its runs: they are logged there again)")
    _objective_argument(p, "override the spec's objective; simulate replays the sweep with the scaling law (and "
                           "skips calibration)")
    p.add_argument("--address", help="an existing Ray cluster to run on (default: RAY_ADDRESS, else local Ray)")
    p.add_argument("--tracking-uri", help="MLflow store: sqlite:///path/mlflow.db or http(s)://server "
                                          "(default: the spec's, else $MLFLOW_TRACKING_URI, else "
                                          "sqlite:///<cwd>/loopscale-runs/mlflow.db)")
    p.add_argument("--verbose", action="store_true", help="show Ray Tune's and Optuna's own logs")
    _set_argument(p)
    p.set_defaults(func=_search)


def _search(args: argparse.Namespace) -> int:
    from .spec import SweepSpec

    spec = SweepSpec.from_toml(args.spec, args.sets, objective=args.objective, address=args.address,
                               tracking_uri=args.tracking_uri)
    from .tune.driver import run_search  # imports Ray (~2 s): only once the spec is known to be good

    run_search(spec, resume=args.resume, verbose=args.verbose)
    return 0


def add_validate(subparsers: argparse._SubParsersAction) -> None:
    from loopscale.analysis.cli import _floats, _ints

    p = subparsers.add_parser(
        "validate", help="train a finished sweep's predicted compute-optimal model at budgets above it, per r, "
                         "and say whether the law held",
        description="From the law fitted to a finished sweep (analyze's default fit), build the buildable "
                    "compute-optimal model at each rung budget (above the sweep's largest) and r, the model "
                    "`loopscale export` lists; train it with the sweep's recipe, data and seed through Ray Tune "
                    "(checkpoints, resume and status as for any trial), log it to the sweep's MLflow experiment "
                    "with stage 'validate', and report its achieved loss against the predicted one: the 95% "
                    "prediction interval of one run, and per r the achieved gap to r = 1 against the predicted "
                    "gap. Run it again to resume; once trained, it prints the comparison.")
    p.add_argument("experiment", help="the sweep's name (its MLflow experiment); the rungs use the spec it ran with")
    p.add_argument("--budget", type=_floats, required=True, dest="budgets",
                   help="rung budgets in FLOPs, comma-separated, each above the sweep's largest, e.g. 2e13")
    p.add_argument("--r", type=_ints, default=None, dest="recurrences",
                   help="recurrence counts, comma-separated (default: every r of the sweep)")
    p.add_argument("--tracking-uri", help=STORE_HELP)
    p.add_argument("--verbose", action="store_true", help="show Ray Tune's and Optuna's own logs")
    p.set_defaults(func=_validate)


def _validate(args: argparse.Namespace) -> int:
    from loopscale.analysis.store import resolve_tracking_uri
    from loopscale.analysis.validation import lines

    from .validate import achieved_table, check_request, plan_rungs, ran_spec

    check_request(args.budgets, args.recurrences)  # before the sweep is read: bad input is one line at once
    spec = ran_spec(args.experiment, resolve_tracking_uri(args.tracking_uri))
    from .tune.driver import SweepState, run_search  # imports Ray (~2 s): only once the spec is known to be good

    state = SweepState(spec.placement.storage, spec.name)
    saved = state.load()
    if saved is None:  # a sweep logged before its storage was recorded, validated from another folder
        raise ValueError(f"no Tune state of sweep {spec.name!r} at {state.path}; run `loopscale validate` in the "
                         "folder its search ran in")
    if not saved.get("complete"):
        raise ValueError(f"sweep {spec.name!r} is not complete in {spec.placement.storage}; finish it first "
                         "(`loopscale search SPEC --resume`), then validate it")
    plan = plan_rungs(spec, args.budgets, args.recurrences)
    if plan.complete:
        print(f"the rungs of sweep {spec.name!r} are trained already")
        print("\n".join(lines(achieved_table(spec, plan))))
        return 0
    again = (f"loopscale validate {spec.name} --budget {','.join(f'{c:g}' for c in args.budgets)}"
             + (f" --r {','.join(map(str, args.recurrences))}" if args.recurrences else ""))
    run_search(spec, verbose=args.verbose, rungs=plan, resume_with=again)
    return 0


def add_ui(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "ui", help="open the MLflow UI on the sweeps' store (127.0.0.1 unless --host says otherwise)",
        description="Start the MLflow UI on the store the sweeps logged to, print the URL of the experiment's "
                    "runs table, and stop cleanly on Ctrl-C. Compare runs by r, budget and width (tags, params "
                    "and metrics as columns, a train_loss curve per run) and open the analysis run's plots and "
                    "tables. Binds to 127.0.0.1; another --host is reachable by others and gets a warning.")
    p.add_argument("--experiment", help="sweep name to open (default: the list of experiments)")
    p.add_argument("--tracking-uri", help=STORE_HELP)
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=5000, help="port (default 5000)")
    p.set_defaults(func=_ui)


def _ui(args: argparse.Namespace) -> int:
    from loopscale.analysis.store import resolve_tracking_uri

    from .ui import serve

    return serve(resolve_tracking_uri(args.tracking_uri), args.host, args.port, args.experiment)


def add_status(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "status", help="where a running or stopped sweep stands, from any terminal (reads only, takes no lock)",
        description="Read the sweep's runs and its driver lock, without taking it, and print whether it is "
                    "running (and which driver), finished or stopped; trials ended per stage against the plan, "
                    "running and failed ones; FLOPs spent; each cell's best run so far; and an ETA at the pace "
                    "so far.")
    p.add_argument("name", help="the sweep's name (its MLflow experiment)")
    p.add_argument("--tracking-uri", help=STORE_HELP)
    p.set_defaults(func=_status)


def _status(args: argparse.Namespace) -> int:
    from loopscale.analysis.status import sweep_status

    print("\n".join(sweep_status(args.name, args.tracking_uri).lines()))
    return 0


def add_evaluate(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "evaluate", help="evaluate a sweep's kept models at other recurrence counts (val_loss_r<k>), or on tasks",
        description="Reload every kept model of the sweep ([resources] keep_models), run its trained shared block "
                    "r_eval times for each r_eval of --r, measure the loss on the sweep's validation rows exactly "
                    "as its trial did, and log it to the trial's run as val_loss_r<r_eval>; `loopscale analyze` "
                    "then plots loss against r_eval per cell. With --tasks, also score each model on downstream "
                    "tasks per task and axis. An architecture that cannot run an r says so in one line.")
    p.add_argument("experiment", help="the sweep's name (its MLflow experiment)")
    p.add_argument("--r", dest="recurrences", metavar="R1,R2,...",
                   help="recurrence counts to evaluate at, e.g. 1,2,4,8,16 (required without --tasks)")
    p.add_argument("--tasks", metavar="SPEC",
                   help="also score each model on downstream tasks, at its trained r and each --r: the built-in "
                        "probes (probes, or probes:SEED) or a DCLM/CORE-style bundle YAML; logs task.<label>_r<k> "
                        "and axis.<axis>_r<k> (docs/downstream.md)")
    p.add_argument("--tracking-uri", help=STORE_HELP)
    p.add_argument("--device", default="cpu", help="torch device to evaluate on (default cpu; auto: CUDA if any)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads on a CPU (default 0: torch's default, every core; on cores other jobs share, "
                        "1 avoids oversubscription and was 12x faster in docs/log.md's run)")
    p.set_defaults(func=_evaluate)


def _evaluate(args: argparse.Namespace) -> int:
    from .evaluate import evaluate_kept, parse_recurrences, refusals, render

    if args.recurrences is None and args.tasks is None:
        raise ValueError("evaluate needs --r (recurrence counts to evaluate the loss at) or --tasks (downstream tasks)")
    recurrences = parse_recurrences(args.recurrences) if args.recurrences is not None else []
    if args.threads < 0:
        raise ValueError(f"--threads must be >= 0 (0: torch's default), got {args.threads}")
    if args.tasks is not None:
        from . import downstream

        downstream.load_tasks(args.tasks)  # a bad task set is one line before any evaluation
    if recurrences:
        evaluated = evaluate_kept(args.experiment, recurrences, args.tracking_uri, args.device, args.threads)
        for line in refusals(evaluated):
            print(f"loopscale: {line}", file=sys.stderr)
        print("\n".join(render(evaluated, recurrences)))
    if args.tasks is not None:
        tasks, scored = downstream.evaluate_tasks(args.experiment, args.tasks, recurrences, args.tracking_uri,
                                                  args.device, args.threads)
        for line in refusals(scored) if not recurrences else []:  # else said with the losses
            print(f"loopscale: {line}", file=sys.stderr)
        print("\n".join(downstream.render(tasks, scored)))
    return 0


def add_demo(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo", help="the whole study on this machine: the demo sweep (real CPU training), analysis, tables",
        description="Run the demo preset (real training on the embedded King James Bible, ~15 minutes on 2 CPU "
                    "cores), analyse it, print phi with its interval and the allocation table, and say where the "
                    "tables and plots are. Run it again to resume an interrupted demo or to re-analyse a "
                    "finished one.")
    p.add_argument("--tracking-uri", help=STORE_HELP)
    p.add_argument("--verbose", action="store_true", help="show Ray Tune's and Optuna's own logs")
    p.add_argument("--evaluate", action="store_true",
                   help="score the kept models on the built-in probes before the analysis, which then compares the "
                        "r's per axis at matched compute and loss (docs/downstream.md)")
    p.add_argument("--validate", action="store_true",
                   help="end the sweep with a validation rung per r at twice its largest budget: the law's "
                        "compute-optimal model trained there against its prediction (`loopscale plan demo --set "
                        "'validate.budgets=[2.7e12]'` prints what it adds)")
    p.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args.tracking_uri, args.verbose, args.validate, args.evaluate)


def build_parser() -> argparse.ArgumentParser:
    from loopscale.analysis.cli import register as add_analysis  # analyze, export and compare

    subcommands: list[Callable[[argparse._SubParsersAction], None]] = [add_plan, add_check_arch, add_tokenizer,
                                                                       add_search, add_validate, add_status,
                                                                       add_analysis, add_evaluate, add_ui, add_demo]
    parser = argparse.ArgumentParser(
        prog="loopscale",
        description="Find compute-optimal looped language models: sweep (FLOP budget, recurrences) cells with "
                    "Ray Tune + Optuna, log every trial to MLflow, and fit how much one recurrence is worth.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in subcommands:
        add(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    previous = take_signals()  # first: a signal while the parser's imports load, or a sweep starts up
    try:
        args = build_parser().parse_args(argv)
        raise_if_interrupted()  # one that an import's compile swallowed
        return args.func(args)
    except ValueError as exc:
        return _error(str(exc), 2)
    except (RuntimeError, OSError, ImportError) as exc:  # a store or disk that failed, a sweep left incomplete
        interrupt = _interrupt_behind(exc)
        if interrupt is not None:  # a signal inside an import, which Python wrapped (class creation: RuntimeError)
            return _interrupted(interrupt)
        return _error(str(exc), 1)
    except (SweepInterrupted, KeyboardInterrupt) as exc:
        return _interrupted(exc)
    except Exception as exc:  # MLflow's client failing outside a sweep (status, ui): its exception, unwrapped
        from loopscale.analysis.store import failure_text, store_failure_types

        interrupt = _interrupt_behind(exc)
        if interrupt is not None:
            return _interrupted(interrupt)
        if not isinstance(exc, store_failure_types()):
            raise
        return _error(f"the MLflow store failed: {failure_text(exc)}", 1)
    finally:
        restore_signals(previous)


def _error(message: str, code: int) -> int:
    """``print_error``, imported when an error comes (its module's imports are not free, see the top)."""
    from loopscale.analysis.store import print_error

    return print_error(message, code)


def _interrupt_behind(exc: BaseException) -> BaseException | None:
    """The SIGINT or SIGTERM that ``exc`` was raised from, if any: its cause or context at any depth, or else a
    signal ``interrupt`` noted while the command imported, whose exception a library turned into its own
    without a link (pydantic-core's ``SchemaError`` quotes it as text: 1 of 8 SIGTERMs in the first second under
    load)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, (SweepInterrupted, KeyboardInterrupt)):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return noted_interrupt()


def _interrupted(exc: BaseException) -> int:
    """SIGINT / SIGTERM: one line, and 130 / 143, as a shell reports a signal. A KeyboardInterrupt is a SIGINT
    before a sweep took over the signal (imports, spec)."""
    if isinstance(exc, SweepInterrupted):
        print(f"loopscale: {exc}", file=sys.stderr)
        return exc.exit_code
    print("loopscale: interrupted by SIGINT", file=sys.stderr)
    return 128 + signal.SIGINT


def entry() -> None:
    """The ``loopscale`` console script and ``python -m loopscale.search.cli``: ``main``, then ``exit_process``
    with its code."""
    exit_process(main())


def exit_process(code: int) -> None:
    """End the process with ``code`` after Python's own shutdown steps that matter, without the interpreter's
    teardown and C-level ``exit``: non-daemon threads are joined (and executors' workers, through
    ``threading._shutdown``, as at a normal exit), atexit handlers run (Ray's and MLflow's shutdown,
    ``logging.shutdown``, ``weakref.finalize``), stdout and stderr are flushed; then ``os._exit``.

    Why not ``sys.exit``: after the interpreter's teardown, C ``exit`` runs the exit handlers of the native
    libraries loaded. Ray's (``CoreWorkerProcess::HandleAtExit``) destroys the driver's core worker while Ray's
    own threads still use it: a SIGTERM late in ``ray.init``, after the one line was printed, can die there of
    SIGSEGV while another of Ray's threads records metrics (``TaskManager::RecordMetrics``), with no Python
    stack (the fault handler is off by then). Ray ends its own worker processes with ``os._exit`` for the same
    reason. The teardown is also slow: full collections over everything torch, Ray, MLflow and pandas allocated
    (docs/log.md has both measurements). Only the console path exits this way; ``main`` is called in-process by
    tests and returns."""
    threading._shutdown()  # what the interpreter's finalisation calls first; private, but the only complete way
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can reach it
            pass
    os._exit(code)


if __name__ == "__main__":
    entry()
