"""The step probe of ``loopscale plan``: the trial's own optimizer step (its model, optimizers and batch, random
tokens, compiled where the trial compiles) timed here at the narrowest and the widest of the widths the sweep is
likely to train, with as many copies running at once as the sweep runs training trials side by side (separate
processes), and fitted as the affine step-time model of ``walltime.Throughput``.

The two shapes are timed in turns, one step of each per round, and the line is fitted per round and its median
taken (``fit_rounds``). Timed one after the other, a change of load between them (other work on shared cores)
bent the line: the wider shape slowed by others' work read as FLOPs, and the fixed cost per step came out
negative, printed as 0 ms (3 of 15 probes of the example specs on a shared machine, the built-in among them;
docs/log.md 2026-12-06). A round's two steps run back to back, under the same load."""

from __future__ import annotations

import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from loopscale import objectives
from loopscale.model import account, runtime
from loopscale.model.architecture import build
from loopscale.objectives.optimizers import build_optimizers

from ..spec import STAGES, SweepSpec
from .walltime import Throughput, cpus, likely_widths, narrowest_widths

PROBE_MAX_FLOPS = 2e11  # one probe step at most: a few seconds on two CPU cores


def measure_throughput(spec: SweepSpec, max_steps: int = 5, min_seconds: float = 0.5) -> Throughput | None:
    """Time the trial's own optimizer step (its threads, batch, model, optimizers and compilation) at the
    narrowest and the widest of the widths the sweep's training trials are priced at, with as many copies at once as the
    sweep runs trials side by side on a CPU, and fit the step time as affine in the step's FLOPs (``fit_rounds``);
    None if not even the narrowest step is small enough to time quickly. A single timable width gives a pure FLOP
    rate. Built-in or the spec's own architecture alike: the step is the trial's, built by its factory."""
    device = runtime.pick_device("auto" if spec.placement.gpus_per_trial > 0 else "cpu")  # no CUDA here: time the CPU
    trained = [c for stage in STAGES for c in spec.cells(stage) if stage == "calibrate" or spec.objective == "train"]
    shapes = sorted({(float(s), c.r, c) for c in trained for s in likely_widths(spec, c) + narrowest_widths(spec, c)},
                    key=lambda item: _step_flops(spec, item[0], item[1]))
    timable = [item for item in shapes
               if _step_flops(spec, item[0], item[1]) <= PROBE_MAX_FLOPS or device.type == "cuda"]
    if not timable:
        return None
    probes = [timable[0]] if len(timable) == 1 else [timable[0], timable[-1]]
    configs = [spec.trial_config(cell, s, recipe=spec.training.recipe) for s, _, cell in probes]
    copies = 1 if device.type == "cuda" else side_by_side(spec)
    timed = _time_side_by_side(configs, device.type, max(1, int(spec.placement.cpus_per_trial)), copies, max_steps,
                               min_seconds)
    shape = " and ".join(f"s={s:g} r={r} width {spec.grid.model(s, r).width}" for s, r, _ in probes)
    shape += f", {spec.grid.batch_tokens:,} tokens per step"
    setup = sum(t.setup_s for t in timed) / len(timed)
    compile_s = sum(t.compile_s for t in timed) / len(timed)
    common = {"shape": shape, "device": device.type, "setup_s": setup, "compile_s": compile_s,
              "side_by_side": copies}
    flops = [_step_flops(spec, s, r) for s, r, _ in probes]
    per_s, step_s = fit_rounds(flops, [list(r) for r in zip(*(t.steps_s for t in timed))])
    return Throughput(per_s, step_s, **common)


def fit_rounds(flops: list[float], rounds: list[list[float]]) -> tuple[float, float]:
    """(FLOP/s, fixed seconds per step) of the affine step time ``fixed + FLOPs / rate`` through shapes of
    ``flops`` FLOPs per step (one or two), from ``rounds`` of their step seconds, each round's timed back to
    back. Two shapes: each round's line through its two points, and the median of the rounds' slopes and of
    their intercepts (a load change inside one round spoils that round only); a fixed cost below 0 is 0. One
    shape, or a median slope that is not positive (the wider step no slower: noise): a pure rate, the median
    step's FLOP/s at the widest shape."""
    if len(flops) == 2 and flops[1] > flops[0]:
        slopes = [(wide - narrow) / (flops[1] - flops[0]) for narrow, wide in rounds]
        per_flop = statistics.median(slopes)
        if per_flop > 0:
            fixed = statistics.median(narrow - flops[0] * slope for (narrow, _), slope in zip(rounds, slopes))
            return 1.0 / per_flop, max(0.0, fixed)
    return flops[-1] / statistics.median(r[-1] for r in rounds), 0.0


def side_by_side(spec: SweepSpec) -> int:
    """Training trials the sweep runs at once here: the most of any stage that trains, no more than it has."""
    return max([min(spec.concurrency(stage, cpus()), sum(c.n_trials for c in spec.cells(stage)))
                for stage in STAGES if spec.cells(stage) and (stage == "calibrate" or spec.objective == "train")],
               default=1)


def _step_flops(spec: SweepSpec, s: float, r: int) -> float:
    return float(account(spec.grid.model(s, r)).flops_per_token * spec.grid.batch_tokens)


@dataclass(frozen=True)
class _Timing:
    setup_s: float  # building the model and optimizers, and the first eager step's excess
    compile_s: float  # the first compiled step's excess (0 when eager)
    steps_s: tuple[float, ...]  # one step per round, the rounds of every config in step (``_time_steps``)


MIN_ROUNDS = 3  # a median of rounds, not one step


def _time_side_by_side(configs: list[objectives.TrialConfig], device: str, threads: int, copies: int, max_steps: int,
                       min_seconds: float) -> list[_Timing]:
    """Each config's timing averaged over ``copies`` processes that time the configs at the same moment (a
    barrier before the timing), round by round; one copy times them in this process."""
    if copies == 1:
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)  # as a trial runs; shared cores stay fair
        try:
            with tempfile.TemporaryDirectory() as cache:  # a cold compile, as a fresh sweep's first trial
                return _time_steps(configs, torch.device(device), max_steps, min_seconds, cache)
        finally:
            torch.set_num_threads(previous)
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked torch thread pools
    barrier, results = context.Barrier(copies), context.Queue()
    workers = [context.Process(target=_probe_copy, args=(configs, device, threads, max_steps, min_seconds,
                                                          barrier, results), daemon=True) for _ in range(copies)]
    for worker in workers:
        worker.start()
    try:
        timed = [results.get(timeout=600) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=10)
    if any(isinstance(t, str) for t in timed):
        raise RuntimeError(next(t for t in timed if isinstance(t, str)))
    rounds = min(len(t[0].steps_s) for t in timed)  # a copy stops on its own clock: the rounds all of them ran
    return [_Timing(sum(t[i].setup_s for t in timed) / copies, sum(t[i].compile_s for t in timed) / copies,
                    tuple(sum(t[i].steps_s[k] for t in timed) / copies for k in range(rounds)))
            for i in range(len(configs))]


def _probe_copy(configs: list[objectives.TrialConfig], device: str, threads: int, max_steps: int, min_seconds: float,
                barrier: object, results: object) -> None:
    """One copy of the side-by-side probe: build the configs, then time them once the other copies are ready to."""
    torch.set_num_threads(threads)
    runtime.keep_freed_memory(torch.device(device))  # as the trials run (objectives/training.py)
    try:
        with tempfile.TemporaryDirectory() as cache:
            results.put(_time_steps(configs, torch.device(device), max_steps, min_seconds, cache, barrier.wait))
    except Exception as exc:  # the parent raises it: a probe copy that dies silently would hang the plan
        barrier.abort()
        results.put(f"plan's step probe failed: {type(exc).__name__}: {exc}")


def _time_steps(trials: list[objectives.TrialConfig], device: torch.device, max_steps: int, min_seconds: float,
                compile_cache: str, ready: Callable[[], object] = lambda: None) -> list[_Timing]:
    """Each trial's own optimizer step (forward + backward per micro-batch, every optimizer, compiled where the
    trial compiles, into ``compile_cache``) on random tokens, in rounds of one step of each trial (module
    docstring): at least ``MIN_ROUNDS`` and up to ``max_steps`` rounds, no more once ``min_seconds`` have
    passed; and per trial the set-up (building the model and optimizers) and the first step's excess over its
    median step, which is the compile warm-up where it compiles. ``ready`` is called once all are built."""
    built = [_prepared_step(trial, device, compile_cache) for trial in trials]
    ready()
    firsts = [_timed(step, device) for step, _, _ in built]
    rounds: list[list[float]] = []
    started = time.perf_counter()
    while len(rounds) < max_steps and (len(rounds) < MIN_ROUNDS or time.perf_counter() - started < min_seconds):
        rounds.append([_timed(step, device) for step, _, _ in built])
    out = []
    for (_, setup_s, how), first, steps in zip(built, firsts, zip(*rounds)):
        excess = max(0.0, first - statistics.median(steps))
        compiled = how == "compiled"
        out.append(_Timing(setup_s + (0.0 if compiled else excess), excess if compiled else 0.0, steps))
    return out


def _prepared_step(trial: objectives.TrialConfig, device: torch.device,
                   compile_cache: str) -> tuple[Callable[[], None], float, str]:
    """(one optimizer step of the trial, seconds spent building it, how ``runtime.maybe_compile`` ran it)."""
    torch.manual_seed(0)
    started = time.perf_counter()
    config = trial.model_config
    recipe = objectives.normalize_recipe(trial.recipe)
    model = build(config).to(device)
    optimizers = build_optimizers(model, objectives.trial_lrs(trial), recipe, config.vocab_size)
    model, how = runtime.maybe_compile(model, device, recipe["compile"], cpu=recipe["compile_cpu"],
                                       cache_dir=compile_cache)
    rows = trial.batch_tokens // config.seq_len
    micro = (recipe["micro_batch"] or trial.batch_tokens) // config.seq_len
    tokens = torch.randint(0, config.vocab_size, (rows, config.seq_len + 1), device=device)

    def step() -> None:
        for batch in tokens.split(micro):
            with runtime.autocast(device, recipe["bf16"]):
                loss = model(batch[:, :-1], batch[:, 1:])
            (loss / max(1, rows // micro)).backward()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return step, time.perf_counter() - started, how


def _timed(step: Callable[[], None], device: torch.device) -> float:
    started = time.perf_counter()
    step()
    _sync(device)
    return time.perf_counter() - started


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
