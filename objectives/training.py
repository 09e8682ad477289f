"""The training trial: build the trial's model, train it for exactly the tokens its FLOP budget buys, evaluate.

D comes from ``model.tokens_for_budget`` (whole optimizer steps of ``batch_tokens``, never more than C), so
``flops_spent = F * D`` is within one step of the budget. Validation loss is the mean cross-entropy in nats per
token over the sweep's fixed validation rows (every target of every row), plus bits per byte for text, measured
with the module in evaluation mode (``evaluate``).

The trial's fields (``objectives.trial.TrialConfig``) a training trial reads, beyond its shape and budget
(defaults in brackets)::

    data          dict   data source spec (objectives.data.spec) [None: {"source": "kjv"}]
    recipe        dict   optimizer / schedule options (objectives.recipe) [paper-like defaults]
    device        str    "auto" | "cpu" | "cuda" | "cuda:1" ... ["auto"]
    num_threads   int    torch threads for this trial, from the resources Ray gives it [0: torch's default]
    cache_dir     str    packed-data cache shared by the sweep ["": objectives.data.cache.default_cache_dir()]
    val_tokens    int    size of the fixed validation set in target tokens [65536]
    seed          int    model initialisation (torch.manual_seed) [0]; the batch order comes from data.seed,
                         which every trial of a sweep shares

The config is checked where the search builds it (a budget that buys no step, a batch that is not whole rows
are refused there, in one line); training takes it as it is.

Warmdown branches (the paper's training script has them; objectives/branches.py): with ``recipe.schedule =
"wsd"``, a trial of budget C also records the loss at D_k = ``tokens_for_budget`` (C_k) for every C_k < C of
``branches.branch_budgets`` (the recipe's list and the trial's own). At step f_k = ``warmdown_start`` (D_k's steps), still in the trial's constant phase, it saves the
model and optimizer states, trains steps f_k .. S_k - 1 on the same batches with the rates a wsd run of S_k
steps would use (a linear warmdown), evaluates, and restores the saved states. Up to float noise, the branch
is the run trained for D_k outright (same init, same data order, same rates), for the price of its warmdown
(``cost_flops`` = F * (S_k - f_k) * batch), which the trial's ``flops_spent`` includes. Each branch is
returned as ``branch<i>.*`` keys (objectives.trial.BRANCH_KEYS); the runs table makes it a row of its own.

Sampled depth (``template.depth_sampling``, model/depth.py): step t runs the shared block ``draw_depth(config,
seed, t)`` times, every micro-batch and worker of the step alike; the budget's tokens come from the expected FLOPs
per token (model/accounting.py), and validation runs at the trial's r.

A loss that turns NaN/inf or exceeds ``diverge_factor`` times the first loss ends the trial early with
``status = "diverged"`` and a ``reason``; it is returned, never raised. Steps, tokens and FLOPs then count
what was actually trained.

Checkpoints (objectives/checkpoint.py): given a ``Checkpointing``, a one-worker trial restores the latest state
it saved before its first step and saves one every ``period_s`` seconds of training, and when the trial is
about to be stopped, at a step boundary;
resumed, it makes its saved progress reports again, each marked with ``RESUME_KEYS`` (objectives.trial), then
goes on exactly where the state ended, and returns ``RESUME_KEYS`` with its metrics. Data parallel, every
worker restores the same state and calls ``save`` at the same step boundary (rank 0 decides when; the caller
writes rank 0's state: the model and optimizers are replicas).

Data parallel: called in every process of an initialised ``torch.distributed`` group (k workers: Ray Train
sets it up, search/tune/trial.py), each process trains the same model (same seed) on its ``1/k`` share of
every optimizer step's rows, and ``DistributedDataParallel`` averages the gradients, so the update is the
one-process update on the whole batch up to floating-point summation order: the global batch, tokens, FLOPs
and the loss curve are those of one worker. Reported losses and the validation loss are averaged over the
workers; tokens per second count all of them, and MFU divides by k devices' peak.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from loopscale.model import LoopedConfig, runtime
from loopscale.model.architecture import build
from loopscale.model.depth import draw_depth

from .data.batches import Batches, rows_per_batch
from .data.cache import PackedData, default_cache_dir, open_packed, prepare_data
from .peak import device_peak_flops
from .optimizers import build_optimizers, set_lr
from .recipe import group_lrs, lr_multiplier, normalize_recipe
from .branches import branch_budgets, branch_metrics, branch_plan, trial_flops
from .checkpoint import Checkpointing, rng_state, set_rng_state
from .kept import kept_bytes
from .testing import after_trial, before_trial
from .trial import TrialConfig, accounting_metrics, module_metrics

Report = Callable[[dict[str, Any]], None]
Keep = Callable[[bytes], None]


def trial_data(trial: TrialConfig, config: LoopedConfig) -> Batches:
    """A trial's training batches over its memory-mapped data; builds the cache if no driver did."""
    seq_len = config.seq_len
    cache_dir = trial.cache_dir or default_cache_dir()
    fingerprint = prepare_data(trial.data, seq_len, cache_dir, trial.val_tokens)
    packed = open_packed(cache_dir, fingerprint)
    if packed.meta["vocab_size"] > config.vocab_size:
        raise ValueError(f"data vocabulary {packed.meta['vocab_size']} exceeds the model's vocab_size "
                         f"{config.vocab_size}")
    return Batches(packed, rows_per_batch(trial.batch_tokens, seq_len), trial.order_seed)


def train(trial: TrialConfig, report: Report | None = None,
          checkpoint: Checkpointing | None = None, keep: Keep | None = None) -> dict[str, Any]:
    """Train the trial's model to its FLOP budget and return ``METRIC_KEYS`` (module docstring); with
    ``checkpoint``, from its latest saved state where it has one, and saving one every ``period_s`` seconds
    (objectives/checkpoint.py); with ``keep``, hand it the trained model's file (objectives/kept.py) once the
    trial ends "ok", before returning (so a trial's receipt, written after, implies its model is saved)."""
    before_trial(trial)  # the test aids of timing (objectives/testing.py), outside the trial's wall time
    started = time.perf_counter()
    config = trial.model_config
    recipe = normalize_recipe(trial.recipe)
    batch_tokens = trial.batch_tokens
    plan = accounting_metrics(config, trial.budget_flops, batch_tokens)
    group = _Group.current()
    micro_rows = _micro_rows(recipe, group.share(batch_tokens, config.seq_len), config.seq_len)
    if trial.num_threads:
        torch.set_num_threads(trial.num_threads)
    device = runtime.pick_device(trial.device)
    runtime.keep_freed_memory(device)
    batches = trial_data(trial, config)
    packed = batches.packed

    torch.manual_seed(trial.seed)
    model = build(config).to(device)  # the spec's architecture (model/architecture.py); LoopedLM by default
    lrs = group_lrs(recipe, trial.template, config, plan["tokens"], batch_tokens)
    optimizers = build_optimizers(model, lrs, recipe, config.vocab_size)
    saved = checkpoint.restore() if checkpoint is not None else None
    if saved is not None:
        model.load_state_dict(saved["model"])
        for optimizer, state in zip(optimizers, saved["optimizers"], strict=True):
            optimizer.load_state_dict(state)
        set_rng_state(saved["rng"])
    step_model, _ = runtime.maybe_compile(group.wrap(model, device), device, recipe["compile"],
                                          cpu=recipe["compile_cpu"])
    depth = None if config.depth_sampling == "fixed" else functools.partial(draw_depth, config, trial.seed)
    loop = _TrainLoop(step_model, optimizers, batches, recipe, device, micro_rows, group, depth)
    branches = branch_plan(branch_budgets(trial), recipe["warmdown_frac"], config, trial.budget_flops, plan["steps"],
                           batch_tokens)

    train_started = time.perf_counter()
    outcome = loop.run(plan["steps"], batch_tokens, report, branches=branches, raw_model=model,
                       checkpoint=checkpoint, saved=saved)
    train_wall = time.perf_counter() - train_started

    steps_done = outcome["steps"]
    tokens = steps_done * batch_tokens
    flops_spent = trial_flops(plan["flops_per_token"], tokens, outcome["branches"], batch_tokens)
    reason = outcome["reason"]
    val_loss = float("nan") if reason else evaluate(step_model, packed, device, recipe["bf16"], micro_rows, group)
    if not reason and not math.isfinite(val_loss):
        reason = f"validation loss {val_loss} after step {steps_done}"
    measured = {} if reason else module_metrics(model)
    if keep is not None and not reason:
        keep(kept_bytes(model, trial))
    peak = device_peak_flops(device) * group.world
    bytes_per_token = packed.meta["bytes_per_token"]
    result = {
        **plan,
        "tokens": tokens, "steps": steps_done, "flops_spent": flops_spent,
        "val_loss": val_loss,
        "val_bpb": val_loss / math.log(2) / bytes_per_token if bytes_per_token else float("nan"),
        "train_loss": outcome["train_loss"],
        "s": trial.s,
        "lr": lrs["matrices"],
        "tokens_per_s": tokens / train_wall if train_wall > 0 else float("nan"),
        "mfu": flops_spent / train_wall / peak if train_wall > 0 else float("nan"),
        "wall_s": time.perf_counter() - started,
        "status": "diverged" if reason else "ok",
        "reason": reason,
        **branch_metrics(outcome["branches"], plan["flops_per_token"], batch_tokens),
        **outcome["resumed"],
        **measured,
    }
    after_trial(trial)
    return result


class _TrainLoop:
    """The optimizer-step loop; the host reads the loss only every ``log_every`` steps (and after step 0).
    ``depth``: the recurrences of each step at sampled depth (model/depth.py), None at fixed depth."""

    def __init__(self, model: torch.nn.Module, optimizers: list[torch.optim.Optimizer], batches: Batches,
                 recipe: dict[str, Any], device: torch.device, micro_rows: int, group: "_Group",
                 depth: Callable[[int], int] | None = None):
        self.model, self.optimizers, self.batches, self.recipe = model, optimizers, batches, recipe
        self.device, self.micro_rows, self.group, self.depth = device, micro_rows, group, depth

    def step(self, step: int, steps: int) -> torch.Tensor:
        """One optimizer step on batch ``step`` at the rate of step ``step`` of a ``steps``-step run; its loss
        (this worker's)."""
        group = self.group
        n_micro = self.batches.rows_per_step // group.world // self.micro_rows
        set_lr(self.optimizers, lr_multiplier(self.recipe, step, steps))
        rows = self.batches.batch(step, group.rank, group.world)
        batch = torch.from_numpy(rows).to(self.device, non_blocking=True)
        total = torch.zeros((), device=self.device)
        depth = {} if self.depth is None else {"recurrences": self.depth(step)}  # one s for the whole step
        for i, micro in enumerate(batch.split(self.micro_rows)):
            with group.sync_gradients(self.model, i == n_micro - 1):
                with runtime.autocast(self.device, self.recipe["bf16"]):
                    loss = self.model(micro[:, :-1], micro[:, 1:], **depth)
                (loss / n_micro).backward()
            total += loss.detach() / n_micro
        for optimizer in self.optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return total

    def branch(self, plan: dict[str, Any], raw_model: torch.nn.Module) -> dict[str, Any]:
        """Warm down from here (step ``plan["fork"]``) to ``plan["steps"]``, evaluate, restore the states."""
        saved = copy.deepcopy(raw_model.state_dict())
        saved_optimizers = [copy.deepcopy(o.state_dict()) for o in self.optimizers]
        for step in range(plan["fork"], plan["steps"]):
            self.step(step, plan["steps"])
        val_loss = evaluate(self.model, self.batches.packed, self.device, self.recipe["bf16"], self.micro_rows,
                            self.group)
        raw_model.load_state_dict(saved)
        for optimizer, state in zip(self.optimizers, saved_optimizers):
            optimizer.load_state_dict(state)
        return {**plan, "val_loss": val_loss}

    def _due(self, checkpoint: Checkpointing, since_s: float, reported: bool) -> bool:
        """Whether to save a state after this step. Data parallel: rank 0 decides, after a reported step only
        (the one step in ``log_every`` that syncs the host already), and every worker follows, so that all of
        them call ``save`` (rank 0 writes) at the same step."""
        if self.group.world == 1:
            return checkpoint.due(since_s)
        if not reported:
            return False
        return bool(self.group.broadcast(torch.tensor(float(checkpoint.due(since_s)), device=self.device)).item())

    def run(self, steps: int, batch_tokens: int, report: Report | None, *, branches: list[dict[str, Any]] = (),
            raw_model: torch.nn.Module | None = None, checkpoint: Checkpointing | None = None,
            saved: dict[str, Any] | None = None) -> dict[str, Any]:
        """Steps 0 .. ``steps`` - 1, or from where the ``saved`` state ended (its progress reports made again,
        marked with ``RESUME_KEYS``, so the caller's curve is whole), saving a state when ``checkpoint`` is due."""
        recipe, group = self.recipe, self.group
        window = torch.zeros((), device=self.device)  # summed step losses since the last check
        window_steps, first_loss, last_mean, start, done, curve, resumed = 0, None, float("nan"), 0, [], [], {}
        if saved is not None:
            kept = saved["loop"]
            start, window_steps, first_loss, last_mean = (kept["step"], kept["window_steps"], kept["first_loss"],
                                                          kept["last_mean"])
            window += kept["window"].to(self.device)
            done, curve = list(kept["branches"]), list(kept["curve"])
            resumed = {"resumes": saved["resumes"] + 1, "resumed_from_step": start}
            for point in curve if report is not None else ():
                report({**point, **resumed})
        pending = sorted((b for b in branches if b["fork"] >= start), key=lambda b: b["fork"])
        saved_at = time.monotonic()
        for step in range(start, steps):
            while pending and pending[0]["fork"] == step:
                done.append(self.branch(pending.pop(0), raw_model))
            window += self.step(step, steps)
            window_steps += 1
            reported = step == 0 or (step + 1) % recipe["log_every"] == 0 or step + 1 == steps
            if reported:
                last_mean = group.mean(window).item() / window_steps
                window.zero_()
                window_steps = 0
                first_loss = last_mean if first_loss is None else first_loss
                reason = _divergence(last_mean, first_loss, recipe["diverge_factor"], step + 1)
                if reason:
                    return {"steps": step + 1, "train_loss": last_mean, "reason": reason, "branches": done,
                            "resumed": resumed}
                point = {"train_loss": last_mean, "step": step + 1, "tokens": (step + 1) * batch_tokens}
                curve.append(point)
                if report is not None:
                    report({**point, **resumed})
            if (checkpoint is not None and step + 1 < steps
                    and self._due(checkpoint, time.monotonic() - saved_at, reported)):
                checkpoint.save({
                    "model": raw_model.state_dict(), "optimizers": [o.state_dict() for o in self.optimizers],
                    "rng": rng_state(), "resumes": resumed.get("resumes", 0),
                    "loop": {"step": step + 1, "window": window, "window_steps": window_steps,
                             "first_loss": first_loss, "last_mean": last_mean, "branches": done, "curve": curve}})
                saved_at = time.monotonic()
        return {"steps": steps, "train_loss": last_mean, "reason": "", "branches": done, "resumed": resumed}


def _divergence(loss: float, first_loss: float, factor: float, step: int) -> str:
    """Why the run counts as diverged at ``step``, or "" if it does not."""
    if not math.isfinite(loss):
        return f"train loss {loss} at step {step}"
    if loss > factor * first_loss:
        return f"train loss {loss:.3f} at step {step} exceeds {factor:g} x the first loss {first_loss:.3f}"
    return ""


@torch.no_grad()
def evaluate(model: torch.nn.Module, packed: PackedData, device: torch.device, bf16: bool, rows: int,
             group: "_Group | None" = None) -> float:
    """Mean cross-entropy (nats per token) over every target of the fixed validation rows (data parallel:
    each worker takes every k-th chunk and the sums are added up).

    One mode for every evaluation, in a trial (its end and each warmdown branch) and of a kept model alike: the
    module in evaluation mode (``model.eval()``; its training mode is restored after), as it is served. A module's
    optional ``loopscale_metrics_reset()`` is called first, so that ``loopscale_metrics()`` read after it describes
    this evaluation alone, not the branches' before it."""
    group = group or _Group()
    reset = getattr(_own_module(model), "loopscale_metrics_reset", None)
    if reset is not None:
        reset()
    training = model.training
    model.eval()
    try:
        total = torch.zeros((), device=device, dtype=torch.float64)
        for start in range(group.rank * rows, len(packed.val), rows * group.world):
            chunk = torch.from_numpy(packed.val[start:start + rows].astype("int64")).to(device, non_blocking=True)
            with runtime.autocast(device, bf16):
                total += model(chunk[:, :-1], chunk[:, 1:]).double() * len(chunk)
    finally:
        model.train(training)
    return float(group.sum(total).item() / len(packed.val))


def _own_module(model: torch.nn.Module) -> torch.nn.Module:
    """The architecture's own module inside a DistributedDataParallel or torch.compile wrapper."""
    while True:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):  # torch.compile's OptimizedModule
            model = model._orig_mod
        else:
            return model


def validation_loss(model: torch.nn.Module, trial: TrialConfig, device: str = "auto") -> float:
    """``evaluate`` of a trained ``model`` on the validation rows of ``trial``'s data, with the trial's
    precision and micro-batch rows, as ``train`` ends: a kept model reloaded (objectives/kept.py) reproduces its
    trial's ``val_loss``, and evaluations at other recurrence counts are measured the same way."""
    recipe = normalize_recipe(trial.recipe)
    config = trial.model_config
    target = runtime.pick_device(device)
    packed = trial_data(trial, config).packed
    rows = _micro_rows(recipe, trial.batch_tokens, config.seq_len)
    return evaluate(model.to(target), packed, target, recipe["bf16"], rows)


def _micro_rows(recipe: dict[str, Any], batch_tokens: int, seq_len: int) -> int:
    """Rows per micro-batch; the micro-batch must be whole rows and divide the batch."""
    micro = recipe["micro_batch"] or batch_tokens
    if micro % seq_len or batch_tokens % micro:
        raise ValueError(f"recipe.micro_batch {micro} must be a multiple of seq_len {seq_len} and divide "
                         f"batch_tokens {batch_tokens}")
    return micro // seq_len


class _Group:
    """This process's place in a data-parallel group: rank and world size from an initialised
    ``torch.distributed`` process group, else one worker (rank 0 of 1) for which every method is a no-op."""

    def __init__(self, rank: int = 0, world: int = 1):
        self.rank, self.world = rank, world

    @classmethod
    def current(cls) -> "_Group":
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    def share(self, batch_tokens: int, seq_len: int) -> int:
        """Tokens per optimizer step of this worker: an equal share of whole rows."""
        rows = rows_per_batch(batch_tokens, seq_len)
        if rows % self.world:
            raise ValueError(f"batch_tokens {batch_tokens} is {rows} rows of seq_len {seq_len}, which "
                             f"{self.world} workers cannot share equally")
        return batch_tokens // self.world

    def wrap(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """``DistributedDataParallel`` around the model when there are several workers. Buffers are not synced
        before each forward (the model's are constants), so a forward pass alone, as in evaluation, communicates
        nothing."""
        if self.world == 1:
            return model
        return torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None, forward_sync_buffers=False)

    def sync_gradients(self, model: torch.nn.Module, last_micro_batch: bool):
        """Gradients are averaged once per optimizer step, in the backward pass of its last micro-batch."""
        if self.world == 1 or last_micro_batch:
            return contextlib.nullcontext()
        return getattr(model, "_orig_mod", model).no_sync()

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            value = value.clone()
            dist.all_reduce(value)  # SUM: the one reduction every backend (gloo, nccl) has
        return value

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        return self.sum(value) / self.world

    def broadcast(self, value: torch.Tensor) -> torch.Tensor:
        """Rank 0's ``value`` on every worker."""
        if self.world > 1:
            dist.broadcast(value, src=0)
        return value
