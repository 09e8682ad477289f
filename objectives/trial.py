"""The trial config: what the search hands to ONE trial, and what every trial reports back.

``TrialConfig`` is one typed, frozen record, built and checked once, by the search (search/space.py), where a
proposal becomes a trial; an invalid one cannot exist, so the objectives take its fields as they are. Tune
ships it to the trial as plain data (its searcher, its experiment state and ``--resume`` need a dict), the same
dict MLflow logs as the run's params: ``to_params`` and ``from_params`` turn it into that dict and back::

    budget_flops  float   the FLOP budget C of the trial's cell; it buys at least one optimizer step
    r             int     recurrences
    s             float   width multiplier; width = ceil(width_unit * s / head_dim) * head_dim
    template      dict    keyword arguments of ``LoopedConfig.iso_depth`` other than s and r
                          (depth, prelude, coda, width_unit, head_dim, seq_len, vocab_size, injection, bptt_k,
                          depth_sampling, lanes)
    batch_tokens  int     tokens per optimizer step, whole rows of seq_len
    seed          int     model initialisation (and a sampled depth's draws; a simulated trial's deviations)
    objective     str     "train" | "simulate"
    branch_budgets list   smaller budgets the law sampler chose for this trial's warmdown branches, beyond the
                          recipe's (objectives/branches.py); in the params only when there are some
    law, noise, cell_noise, misspec
                          simulate only: JointLaw fields (None: the paper's fit), the deviations in nats
                          (objectives.noise)
    testing       dict    the test aids (objectives/testing.py: all of them when simulated, those of timing when
                          trained); in the params only when set
    data, recipe, device, num_threads, cache_dir, val_tokens
                          train only (see objectives.train)
    order_seed    int     train only: the trial's own batch order (objectives/data/batches.py); in the params
                          only when set, else the data seed alone orders the batches of every trial alike

Both objectives return a dict with ``METRIC_KEYS`` (and nothing else, but for a training trial with warmdown
branches: ``branch<i>.<name>`` for each branch i and each of ``BRANCH_KEYS``, see objectives/training.py; and
for a module with ``loopscale_metrics()``: ``module.<name>``, ``module_metrics``): ``val_loss`` in nats per
token, ``val_bpb`` bits per byte (NaN where it does not apply: simulated trials, synthetic data), ``status``
"ok" | "diverged" and ``reason`` ("" when ok). A training trial resumed from a checkpoint
(objectives/checkpoint.py) also returns ``RESUME_KEYS``, and marks its progress reports with them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from loopscale.model import LoopedConfig, account, tokens_for_budget

from .noise import Noise

OBJECTIVES = ("train", "simulate")
DEFAULT_VAL_TOKENS = 65_536
_COMMON = ("budget_flops", "r", "s", "template", "batch_tokens", "seed", "objective", "branch_budgets")
# in the params only when set: old sweeps' dicts lack them
_UNLESS_SET = ("branch_budgets", "law", "testing", "order_seed")
_BY_OBJECTIVE = {"train": ("data", "recipe", "device", "num_threads", "cache_dir", "val_tokens", "order_seed",
                           "testing"),
                 "simulate": ("noise", "cell_noise", "misspec", "law", "testing")}
_FLOATS = ("budget_flops", "s", "noise", "cell_noise", "misspec")  # JSON and Tune's state keep 1e12 as 1000000000000
_INTS = ("r", "batch_tokens", "seed", "num_threads", "val_tokens", "order_seed")


@dataclass(frozen=True)
class TrialConfig:
    """One trial (module docstring). Construction checks it (one ValueError line), and so does
    ``dataclasses.replace``: every TrialConfig that exists is a valid trial."""

    budget_flops: float
    r: int
    s: float
    template: Mapping[str, Any]
    batch_tokens: int
    seed: int = 0
    objective: str = "train"
    branch_budgets: tuple[float, ...] = ()
    data: Mapping[str, Any] | None = None
    recipe: Mapping[str, Any] = field(default_factory=dict)
    device: str = "auto"
    num_threads: int = 0  # 0: torch's default
    cache_dir: str = ""  # "": objectives.data.cache.default_cache_dir()
    val_tokens: int = DEFAULT_VAL_TOKENS
    order_seed: int | None = None
    noise: float = Noise.noise
    cell_noise: float = Noise.cell_noise
    misspec: float = Noise.misspec
    law: Mapping[str, float] | None = None
    testing: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        _require(self.objective in OBJECTIVES, f"objective must be one of {', '.join(OBJECTIVES)}, "
                                                f"got {self.objective!r}")
        _require(_number(self.budget_flops) and 0 < self.budget_flops < math.inf,
                 f"budget_flops must be a positive finite FLOP count, got {self.budget_flops!r}")
        _require(isinstance(self.r, int) and self.r >= 1, f"r must be a whole number >= 1, got {self.r!r}")
        _require(_number(self.s) and 0 < self.s < math.inf, f"s must be a positive width multiplier, got {self.s!r}")
        _require(isinstance(self.batch_tokens, int) and self.batch_tokens > 0,
                 f"batch_tokens must be a whole number > 0, got {self.batch_tokens!r}")
        _require(all(_number(b) and 0 < b < self.budget_flops for b in self.branch_budgets),
                 f"branch_budgets must be budgets below the trial's {self.budget_flops:.3g}, got "
                 f"{list(self.branch_budgets)}")
        _require(self.order_seed is None or (isinstance(self.order_seed, int) and self.order_seed >= 0),
                 f"order_seed must be a whole number >= 0 or unset, got {self.order_seed!r}")
        _require(isinstance(self.val_tokens, int) and self.val_tokens > 0,
                 f"val_tokens must be a whole number > 0, got {self.val_tokens!r}")
        config = self.model_config
        _require(self.batch_tokens % config.seq_len == 0,
                 f"batch_tokens {self.batch_tokens} is not a multiple of seq_len {config.seq_len}")
        _require(tokens_for_budget(config, self.budget_flops, self.batch_tokens) >= self.batch_tokens,
                 f"budget {self.budget_flops:.3g} FLOPs buys no optimizer step of {self.batch_tokens} tokens at "
                 f"width {config.width} (s={self.s:g}, r={self.r})")

    @property
    def model_config(self) -> LoopedConfig:
        """The model shape of the trial: the iso-depth template at its s and r."""
        return LoopedConfig.iso_depth(self.s, self.r, **self.template)

    @property
    def noise_model(self) -> Noise:
        return Noise(noise=self.noise, cell_noise=self.cell_noise, misspec=self.misspec)

    def to_params(self) -> dict[str, Any]:
        """The plain dict Tune ships and MLflow logs: the common keys and the objective's own; ``branch_budgets``,
        ``law``, ``testing`` and ``order_seed`` only when set."""
        out = {k: _plain(getattr(self, k)) for k in (*_COMMON, *_BY_OBJECTIVE[self.objective])}
        return {k: v for k, v in out.items() if not (k in _UNLESS_SET and v in (None, [], {}))}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "TrialConfig":
        """The trial of a ``to_params`` dict (numbers retyped as JSON and Tune's state may have left them);
        a dict this version of loopscale did not write is refused in one line."""
        if not isinstance(params, Mapping):
            raise ValueError(f"a trial config must be a dict of trial settings, got {type(params).__name__}")
        objective = params.get("objective")
        known = (*_COMMON, *_BY_OBJECTIVE.get(objective, ()))
        unknown = sorted(set(params) - set(known))
        missing = [k for k in ("budget_flops", "r", "s", "template", "batch_tokens") if k not in params]
        if objective not in OBJECTIVES or unknown or missing:
            what = (f"objective {objective!r}" if objective not in OBJECTIVES else
                    f"unknown key(s) {', '.join(unknown)}" if unknown else f"no {', '.join(missing)}")
            raise ValueError(f"trial config with {what}: it was not written by this version of loopscale")
        values = dict(params)
        for key in _FLOATS:
            if _number(values.get(key)):
                values[key] = float(values[key])
        for key in _INTS:
            if _number(values.get(key)) and float(values[key]).is_integer():
                values[key] = int(values[key])
        values["branch_budgets"] = tuple(float(b) for b in values.get("branch_budgets", ()))
        return cls(**values)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(f"trial config: {message}")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _plain(value: Any) -> Any:
    """Mappings as plain dicts (Tune, JSON and MLflow take those)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


METRIC_KEYS = (
    "val_loss", "val_bpb", "train_loss", "tokens", "steps", "flops_per_token", "budget_flops", "flops_spent",
    "N_once", "N_rec", "N", "N_embed", "width", "s", "r", "n_prelude", "n_recur", "n_coda", "lr",
    "tokens_per_s", "mfu", "wall_s", "status", "reason",
)

# A warmdown branch's point: the budget whose tokens it reaches, those tokens and steps, the FLOPs of a run
# trained for them outright (F * tokens), its validation loss, and the FLOPs its warmdown cost the trial.
BRANCH_KEYS = ("budget_flops", "tokens", "steps", "flops_spent", "val_loss", "cost_flops")
BRANCH_PREFIX = "branch"

# A trained trial's model file (objectives/kept.py): its artifact's name on the trial's MLflow run, and the end of
# the name of the trial's own copy until the driver keeps it (search/tune/keep.py)
MODEL_FILE = "model.pt"

# A trial resumed from a checkpoint: how many times it was, and the step its last resume started from.
RESUME_KEYS = ("resumes", "resumed_from_step")


# A module's own measurements (``loopscale_metrics()``, docs/own_architecture.md), read after the last evaluation
# (``training.evaluate`` calls the module's ``loopscale_metrics_reset()`` before each)
MODULE_PREFIX = "module."


def module_metrics(module: Any) -> dict[str, float]:
    """``module.<name>`` of each value of the module's optional ``loopscale_metrics()`` (floats, or anything
    ``float`` takes: a 0-d tensor); {} for a module without it. A value that is no number is a ValueError line
    naming it."""
    measure = getattr(module, "loopscale_metrics", None)
    if measure is None:
        return {}
    out = {}
    for key, value in measure().items():
        try:
            out[f"{MODULE_PREFIX}{key}"] = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"loopscale_metrics() must return numbers, got {value!r} for {key!r}") from None
    return out


def is_module_key(key: str) -> bool:
    return key.startswith(MODULE_PREFIX)


def branch_key(index: int, name: str) -> str:
    """The flat metric name of a branch's value, e.g. ``branch0.val_loss``."""
    return f"{BRANCH_PREFIX}{index}.{name}"


def recorded_branches(result: Mapping[str, Any] | None) -> list[tuple[float, Any]]:
    """(budget_flops, val_loss) of each warmdown branch a trial's result records, in order (val_loss None where
    the result lacks it)."""
    out: list[tuple[float, Any]] = []
    while (budget := (result or {}).get(branch_key(len(out), "budget_flops"))) is not None:
        out.append((float(budget), result.get(branch_key(len(out), "val_loss"))))
    return out


def is_branch_key(key: str) -> bool:
    head, dot, name = key.partition(".")
    return bool(dot) and head.startswith(BRANCH_PREFIX) and head[len(BRANCH_PREFIX):].isdigit() and name in BRANCH_KEYS


def accounting_metrics(config: LoopedConfig, budget_flops: float, batch_tokens: int) -> dict[str, Any]:
    """Sizes, tokens and FLOPs of a trial, all from ``model``'s accounting."""
    p = account(config)
    f = p.flops_per_token
    tokens = tokens_for_budget(config, budget_flops, batch_tokens)
    return {"tokens": tokens, "steps": tokens // batch_tokens,
            "flops_per_token": f if isinstance(f, int) else float(f),  # sampled depth's fraction, as stores take it
            "budget_flops": float(budget_flops), "flops_spent": float(f * tokens), "N_once": p.N_once,
            "N_rec": p.N_rec, "N": p.N, "N_embed": p.N_embed, "width": config.width, "r": config.r,
            "n_prelude": config.n_prelude, "n_recur": config.n_recur, "n_coda": config.n_coda}
