"""The step probe of ``loopscale plan``: the trial's own optimizer step (its model, optimizers and batch, random
tokens, compiled where the trial compiles) timed here at the narrowest and the widest of the widths the sweep is
likely to train, with as many copies running at once as the sweep runs training trials side by side (separate
processes), and fitted as the affine step-time model of ``walltime.Throughput``."""

from __future__ import annotations

import multiprocessing
import tempfile
import time
from dataclasses import dataclass

import torch

from loopscale import objectives
from loopscale.model import account, runtime
from loopscale.model.architecture import build
from loopscale.objectives.recipe import build_optimizers

from ..spec import STAGES, SweepSpec
from .walltime import Throughput, cpus, likely_widths, narrowest_widths

PROBE_MAX_FLOPS = 2e11  # one probe step at most: a few seconds on two CPU cores


def measure_throughput(spec: SweepSpec, max_steps: int = 5, min_seconds: float = 0.5) -> Throughput | None:
    """Time the trial's own optimizer step (its threads, batch, model, optimizers and compilation) at the
    narrowest and the widest of the widths the sweep's training trials are priced at, with as many copies at once as the
    sweep runs trials side by side on a CPU, and fit the step time as affine in the step's FLOPs; None if not
    even the narrowest step is small enough to time quickly. A single timable width gives a pure FLOP rate."""
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
    points = [(_step_flops(spec, s, r), t.step_s) for (s, r, _), t in zip(probes, timed)]
    (f0, t0), (f1, t1) = points[0], points[-1]
    common = {"shape": shape, "device": device.type, "setup_s": setup, "compile_s": compile_s,
              "side_by_side": copies}
    if len(timed) == 2 and f1 > f0 and t1 > t0:
        per_flop = (t1 - t0) / (f1 - f0)
        return Throughput(1.0 / per_flop, max(0.0, t0 - f0 * per_flop), **common)
    return Throughput(f1 / t1, 0.0, **common)  # one point (or noise made them disagree): a rate


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
    step_s: float


def _time_side_by_side(configs: list[objectives.TrialConfig], device: str, threads: int, copies: int, max_steps: int,
                       min_seconds: float) -> list[_Timing]:
    """Each config's timing averaged over ``copies`` processes that time it at the same moment (a barrier
    before each config); one copy times it in this process."""
    if copies == 1:
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)  # as a trial runs; shared cores stay fair
        try:
            with tempfile.TemporaryDirectory() as cache:  # a cold compile, as a fresh sweep's first trial
                return [_time_steps(c, torch.device(device), max_steps, min_seconds, cache) for c in configs]
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
    return [_Timing(*(sum(getattr(t[i], f) for t in timed) / copies for f in ("setup_s", "compile_s", "step_s")))
            for i in range(len(configs))]


def _probe_copy(configs: list[objectives.TrialConfig], device: str, threads: int, max_steps: int, min_seconds: float,
                barrier: object, results: object) -> None:
    """One copy of the side-by-side probe: time every config after the other copies are ready to."""
    torch.set_num_threads(threads)
    runtime.keep_freed_memory(torch.device(device))  # as the trials run (objectives/training.py)
    try:
        with tempfile.TemporaryDirectory() as cache:
            out = []
            for config in configs:
                barrier.wait()
                out.append(_time_steps(config, torch.device(device), max_steps, min_seconds, cache))
        results.put(out)
    except Exception as exc:  # the parent raises it: a probe copy that dies silently would hang the plan
        barrier.abort()
        results.put(f"plan's step probe failed: {type(exc).__name__}: {exc}")


def _time_steps(trial: objectives.TrialConfig, device: torch.device, max_steps: int, min_seconds: float,
                compile_cache: str) -> _Timing:
    """The trial's own optimizer step (forward + backward per micro-batch, every optimizer, compiled where the
    trial compiles, into ``compile_cache``) on random tokens: the step averaged over up to ``max_steps`` timed
    steps; the set-up (building the model and optimizers) and the first step's excess over a later one, which is
    the compile warm-up where it compiles."""
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
    built = time.perf_counter() - started

    def step() -> None:
        for batch in tokens.split(micro):
            with runtime.autocast(device, recipe["bf16"]):
                loss = model(batch[:, :-1], batch[:, 1:])
            (loss / max(1, rows // micro)).backward()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    started = time.perf_counter()
    step()
    _sync(device)
    first = time.perf_counter() - started
    started, steps = time.perf_counter(), 0
    while steps < max_steps and (steps == 0 or time.perf_counter() - started < min_seconds):
        step()
        steps += 1
    _sync(device)
    step_s = (time.perf_counter() - started) / steps
    excess = max(0.0, first - step_s)
    if how == "compiled":
        return _Timing(built, excess, step_s)
    return _Timing(built + excess, 0.0, step_s)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
