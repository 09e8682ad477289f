"""The parts of a sweep spec (search/spec.py), one frozen record per idea, each read and checked from its TOML keys
where it is built: the ``Grid`` of cells and the model template, the ``Sampling`` of widths in a cell, the
``Simulation`` a simulated trial replays, the ``Training`` of a trained trial, and the ``Placement`` of trials on
machines and stores.

Each field declares whether it is part of the design (``spec_hash``): a ``PLACEMENT`` field never is (where a
sweep runs may move between resumes), an ``added`` field only off the default that behaves as before it was added,
a ``hashed_as_written`` field only while its key was written with the one value that entered the hash before its
default changed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopscale import objectives
from loopscale.analysis.rate_sensitivity import RATE_FACTORS, stage_name
from loopscale.analysis.store import DEFAULT_RUN_DIR, resolve_tracking_uri
from loopscale.model import (BUILTIN, DEPTH_SAMPLINGS, INJECTIONS, ISO_DEPTH, LoopedConfig, heads_to_s,
                             iso_depth_template, s_to_heads, tokens_for_budget)
from loopscale.objectives.noise import Noise

from .toml_table import Table, require

SAMPLERS = ("law", "gp", "tpe", "grid", "random")
ORDERED_SAMPLERS = ("law", "gp", "tpe")  # their proposals read earlier results: in rounds unless told otherwise
SEEDS = ("shared", "per_trial")  # every trial trains from the sweep's seed, or from its own (Sampling.seeds)
TEMPLATE_KEYS = ("depth", "prelude", "coda", "width_unit", "head_dim", "injection", "bptt_k", "depth_sampling", "lanes",
                 "vocab_size", "architecture", "options")
DEFAULT_TOLERANCE = 0.1  # log width: the law sampler's default precision of a cell's optimum
MAX_WIDTHS = 1000  # whole-head widths in [s_min, s_max]: each is sized per cell while parsing
MAX_SEED = 2**63 - 1  # torch.manual_seed's limit
MAX_CELLS = 256  # budgets x recurrences, ten times the paper's 6 x 4: each cell is sized width by width
RAY_RESOURCE_UNIT = 0.0001  # Ray's resource granularity (ray._raylet.RESOURCE_UNIT_SCALING = 10,000)
LAW_CONSTANTS = ("E", "A", "alpha", "B", "beta", "phi")
DEFAULT_CHECKPOINT_S = 1800  # a trial's checkpoint every 30 minutes of training: a kill loses at most that
KEEP_MODELS = ("best", "all", "none")  # [resources] keep_models: the best trial of each cell, every trial, none
PLACEMENT = {"placement": True}  # where a sweep runs and logs: may move between resumes, so never hashed
AFTER_SWEEP = {"after_sweep": True}  # what runs once the sweep is done and changes none of its trials: never hashed
AS_WRITTEN = {"as_written": True}  # a key as written, where its field holds its default's value (hashed_as_written)


def added(default: Any) -> Any:
    """A field added after sweeps were started: left out of ``spec_hash`` while it holds ``default``, the value
    that behaves as those sweeps did, so an upgrade does not turn a resumable sweep into a "different spec"."""
    return field(default=default, metadata={"hashed_unless": default})


def hashed_as_written(written: str, value: Any) -> Any:
    """A key whose default changed after sweeps were started: the field holds what the sweep does, the field
    ``written`` the key as written (None: not written, ``AS_WRITTEN``), and it enters ``spec_hash`` only where the
    key was written ``value``, the one written value that entered the hash before, so every spec keeps the hash it
    had. The hash then no longer tells the other values apart: the sweep's state records what its stages do
    (search/tune/driver.py ``SweepState``)."""
    return field(default=False, metadata={"hashed_as_written": (written, value)})


def hashed(part: Any) -> dict[str, Any]:
    """The fields of ``part`` that define what a sweep measures, as each declares it."""
    values = dataclasses.asdict(part)
    return {f.name: values[f.name] for f in dataclasses.fields(part)
            if not any(f.metadata.get(kind) for kind in ("placement", "after_sweep", "as_written"))
            and not ("hashed_unless" in f.metadata and values[f.name] == f.metadata["hashed_unless"])
            and not ("hashed_as_written" in f.metadata and _not_written_as(values, *f.metadata["hashed_as_written"]))}


def _not_written_as(values: dict[str, Any], written: str, value: Any) -> bool:
    return values[written] != value


def cell_key(budget: float, r: int) -> str:
    """The cell's name in tags and tables, e.g. ``C=1e+18,r=4``."""
    return f"C={budget:.3g},r={r}"


@dataclass(frozen=True)
class Grid:
    """The cells (FLOP budgets x recurrences), the model template and the widths each cell may try."""

    budgets: tuple[float, ...]
    recurrences: tuple[int, ...]
    template: dict[str, Any]
    s_min: float
    s_max: float
    tokens_per_param: tuple[float, float] | None
    seq_len: int
    batch_tokens: int
    min_steps: int
    first_guess_tokens_per_param: float

    @classmethod
    def parse(cls, t: Table, folder: Path) -> "Grid":
        """The top-level grid keys, ``[template]`` (an architecture file relative to ``folder``) and ``[widths]``;
        ``template`` has no vocab_size yet unless given (``with_vocab_size``)."""
        budgets = tuple(float(b) for b in t.list("budgets", (int, float), required=True))
        require(all(b > 0 and math.isfinite(b) for b in budgets), "budgets must be positive finite FLOP counts")
        require(len(set(budgets)) == len(budgets), "budgets has duplicates")
        recurrences = tuple(t.list("recurrences", (int,), required=True))
        require(all(r >= 1 for r in recurrences), "recurrences must be >= 1")
        require(len(set(recurrences)) == len(recurrences), "recurrences has duplicates")
        cells = len(budgets) * len(recurrences)  # each is sized width by width while parsing, and planned
        require(cells <= MAX_CELLS, f"budgets x recurrences = {len(budgets)} x {len(recurrences)} = {cells} cells, "
                                    f"more than {MAX_CELLS} (the paper's grid is 6 x 4 = 24); split the sweep")
        keys: dict[str, float] = {}
        for b in budgets:  # a cell key names a cell's studies, tags and rows: two cells must not share one
            other = keys.setdefault(cell_key(b, 1), b)
            require(other == b, f"budgets {other:.4g} and {b:.4g} share the cell key {cell_key(b, 1)[:-4]} "
                                f"(3 significant digits); make them differ in the first three")

        template_table = Table(t.table("template"), "[template]", TEMPLATE_KEYS)
        template = {k: template_table.raw[k] for k in TEMPLATE_KEYS[:-2] if k in template_table.raw}
        for key in ("depth", "prelude", "coda", "width_unit", "head_dim", "vocab_size"):
            template_table.int(key)
        template_table.str("injection")
        template_table.int("bptt_k")
        template_table.int("lanes")
        for key in ("width_unit", "head_dim", "bptt_k", "lanes"):  # the width step divides by the first two
            require(template.get(key, 1) >= 1, f"{key} in [template] must be >= 1, got {template.get(key)}")
        # fixed depth as written is fixed depth unwritten: the template, and so the spec's hash, leaves it out
        if template_table.choice("depth_sampling", DEPTH_SAMPLINGS, "fixed") == "fixed":
            template.pop("depth_sampling", None)
        template.update(_architecture(template_table, folder))
        injection = template.get("injection", "linear")  # checked here too: an r = 1 model ignores it
        require(injection in INJECTIONS, f"injection in [template] must be one of {', '.join(INJECTIONS)}, "
                                          f"got {injection!r}")

        widths = Table(t.table("widths", required=True), "[widths]", ("s_min", "s_max", "tokens_per_param"))
        s_min, s_max = widths.number("s_min", required=True), widths.number("s_max", required=True)
        require(0 < s_min <= s_max, f"[widths] needs 0 < s_min <= s_max, got s_min={s_min}, s_max={s_max}")
        tpp = widths.list("tokens_per_param", (int, float))
        if tpp is not None:
            require(len(tpp) == 2 and 0 < tpp[0] < tpp[1],
                     f"[widths] tokens_per_param must be [low, high] with 0 < low < high, got {tpp}")
            tpp = (float(tpp[0]), float(tpp[1]))
        grid = cls(budgets=budgets, recurrences=recurrences, template=template, s_min=float(s_min),
                   s_max=float(s_max), tokens_per_param=tpp, seq_len=t.int("seq_len", default=2048),
                   batch_tokens=t.int("batch_tokens", default=262_144), min_steps=t.int("min_steps", default=10),
                   first_guess_tokens_per_param=float(t.number("first_guess_tokens_per_param", default=20)))
        for key in ("seq_len", "batch_tokens", "min_steps"):
            require(getattr(grid, key) >= 1, f"{key} must be >= 1, got {getattr(grid, key)}")
        require(grid.first_guess_tokens_per_param > 0, "first_guess_tokens_per_param must be positive")
        return grid

    def with_vocab_size(self, data: dict[str, Any] | None) -> "Grid":
        """``[template] vocab_size`` if given (the paper pads its 32,000-token tokenizer to 32,064), else the data
        tokenizer's (``data`` when the sweep reads data, else None), else ``iso_depth``'s default; then the widths
        are checked against the template."""
        if "vocab_size" in self.template:
            vocab = int(self.template["vocab_size"])
        else:
            vocab = int(objectives.vocab_size_of(data)) if data is not None else ISO_DEPTH["vocab_size"]
        grid = dataclasses.replace(self, template={**self.template, "vocab_size": vocab})
        grid._check_shapes()
        return grid

    def _check_shapes(self) -> None:
        for label, s in (("s_min", self.s_min), ("s_max", self.s_max)):
            width = self.width_unit * s
            require(abs(width - round(width)) < 1e-9 and round(width) % self.head_dim == 0,
                     f"[widths] {label} = {s:g} gives width {width:g}, not a multiple of head_dim {self.head_dim}; "
                     f"use s in steps of {self.s_step:g}")
        count = self.heads(self.s_max) - self.heads(self.s_min) + 1
        require(count <= MAX_WIDTHS, f"[widths] s_min..s_max spans {count} widths (s in steps of {self.s_step:g}), "
                                      f"more than {MAX_WIDTHS}; narrow it")
        for r in self.recurrences:
            self.model(self.s_min, r)  # raises the template's own one-line errors (r must divide the shared depth)

    # ---- derived -------------------------------------------------------------------------------------
    @property
    def s_step(self) -> float:
        """s moves in steps of head_dim / width_unit so that every width is a multiple of head_dim."""
        return self.head_dim / self.width_unit

    @property
    def head_dim(self) -> int:
        return int(iso_depth_template(self.template)["head_dim"])

    @property
    def width_unit(self) -> int:
        return int(iso_depth_template(self.template)["width_unit"])

    def heads(self, s: float) -> int:
        """The whole number of heads nearest to width multiplier s."""
        return round(s_to_heads(s, self.width_unit, self.head_dim))

    def s_values(self) -> tuple[float, ...]:
        """Every s in [s_min, s_max] whose width is a whole number of heads."""
        lo, hi = self.heads(self.s_min), self.heads(self.s_max)
        return tuple(heads_to_s(h, self.width_unit, self.head_dim) for h in range(lo, hi + 1))

    def model_template(self) -> dict[str, Any]:
        """Keyword arguments of ``LoopedConfig.iso_depth`` other than s and r (the trial config's template)."""
        return {**self.template, "seq_len": self.seq_len}

    def model(self, s: float, r: int) -> LoopedConfig:
        return LoopedConfig.iso_depth(s, r, **self.model_template())


@dataclass(frozen=True)
class Sampling:
    """How the widths of a cell are sampled: the sampler, its trials per cell and seed, and the law sampler's
    stopping and branching; and whether the trials share one seed of initialisation and batch order.

    ``seeds = "shared"`` (the default) trains every trial from the sweep's seed, in the data seed's batch order:
    common random numbers, so two widths of a cell differ by their width alone, but the seed's own effect on the
    loss is one draw for the whole sweep, which no resampling of its trials can see. ``"per_trial"`` gives each
    trial its own seed for both (``search/tune/studies.trial_seed``), so that effect becomes trial noise the
    interval on phi measures. A simulated trial draws its noise per trial whichever is set (the demo preset,
    whose trials take seeds per trial, replays with ``--objective simulate`` as it would without).

    ``rounds``: a sampler whose proposals read earlier results (``ORDERED_SAMPLERS``) proposes in rounds unless
    the spec writes ``rounds = false``, so the same spec and seed give the same trials whatever order they finish
    in (search/tune/cells.py); ``rounds_written`` is the key as written (None: not written). It was off by default
    before; a spec that leaves it out keeps its hash, and a sweep started then resumes without rounds (its
    recorded state).
    """

    sampler: str
    trials_per_cell: int
    seed: int
    tolerance: float = DEFAULT_TOLERANCE
    branches: bool = False
    information: float = added(0.0)
    deferred_budgets: int = added(1)
    rounds: bool = hashed_as_written("rounds_written", True)
    seeds: str = added("shared")
    rounds_written: bool | None = field(default=None, metadata=AS_WRITTEN)

    @classmethod
    def parse(cls, t: Table) -> "Sampling":
        tolerance = t.number("tolerance", default=DEFAULT_TOLERANCE)
        require(tolerance > 0, f"tolerance must be > 0 (log width), got {tolerance}")
        information = t.number("information", default=0.0)
        require(information >= 0, f"information must be >= 0 (0 = off), got {information}")
        deferred = t.int("deferred_budgets", default=1)
        require(deferred >= 0, f"deferred_budgets must be >= 0 (0 = every cell takes its first trial), got {deferred}")
        sampling = cls(sampler=t.choice("sampler", SAMPLERS, "gp"), trials_per_cell=t.int("trials_per_cell", default=5),
                       seed=t.int("seed", default=0), tolerance=float(tolerance),
                       branches=t.bool("branches", default=False), information=float(information),
                       deferred_budgets=deferred, seeds=t.choice("seeds", SEEDS, "shared"),
                       rounds_written=t.bool("rounds") if "rounds" in t.raw else None)
        sampling = dataclasses.replace(sampling, rounds=sampling.sampler in ORDERED_SAMPLERS
                                       if sampling.rounds_written is None else sampling.rounds_written)
        require(sampling.trials_per_cell >= 1, f"trials_per_cell must be >= 1, got {sampling.trials_per_cell}")
        require(0 <= sampling.seed <= MAX_SEED, f"seed must be in [0, 2**63 - 1], got {sampling.seed}")
        require(not information or sampling.sampler == "law",
                f"information = {information:g} needs sampler = \"law\" (its fitted law values a width), got "
                f"{sampling.sampler!r}")
        require(not sampling.branches or sampling.sampler == "law",
                f"branches = true needs sampler = \"law\" (it chooses where a trial branches), got "
                f"{sampling.sampler!r}")
        require(deferred == 1 or sampling.branches,
                f"deferred_budgets = {deferred} needs branches = true (a deferred cell waits for the larger cells' "
                f"branch points)")
        return sampling


@dataclass(frozen=True)
class Simulation:
    """``[simulate]``: the noise (nats) and the law a simulated trial replays (model/law.py)."""

    noise: float
    law: dict[str, float] | None
    cell_noise: float = Noise().cell_noise
    misspec: float = Noise().misspec

    @classmethod
    def parse(cls, t: Table) -> "Simulation":
        sim = Table(t.table("simulate"), "[simulate]", ("noise", "cell_noise", "misspec", "law"))
        sizes = {k: sim.number(k, default=getattr(Noise(), k)) for k in ("noise", "cell_noise", "misspec")}
        for k, v in sizes.items():
            require(v >= 0, f"[simulate] {k} must be >= 0 nats, got {v}")
        return cls(noise=float(sizes["noise"]), cell_noise=float(sizes["cell_noise"]),
                   misspec=float(sizes["misspec"]), law=_law(sim.table("law")) or None)


@dataclass(frozen=True)
class Calibration:
    """The learning-rate calibration stage: an Optuna study over ``recipe[param]`` in [low, high] (log scale)
    at one reference cell; the best rate is written into the recipe of every search trial, whose transfer
    rule (objectives) then scales it to each width."""

    budget: float
    s: float
    r: int
    trials: int
    low: float
    high: float
    param: str

    @classmethod
    def parse(cls, table: dict[str, Any], grid: Grid) -> "Calibration | None":
        """``[calibrate]``: the calibration stage (it always trains: a simulated trial has no learning rate), or
        None."""
        if not table:
            return None
        t = Table(table, "[calibrate]", ("budget", "s", "r", "trials", "low", "high", "param"))
        cal = cls(budget=float(t.number("budget", required=True)), s=float(t.number("s", required=True)),
                  r=t.int("r", default=1), trials=t.int("trials", default=6),
                  low=float(t.number("low", required=True)), high=float(t.number("high", required=True)),
                  param=t.str("param", default="base_lr"))
        require(0 < cal.low < cal.high, f"[calibrate] needs 0 < low < high, got low={cal.low}, high={cal.high}")
        require(cal.trials >= 1, "[calibrate] trials must be >= 1")
        require(cal.budget > 0, "[calibrate] budget must be positive")
        require(cal.param in objectives.RECIPE_DEFAULTS,
                f"[calibrate] param {cal.param!r} is not a recipe key ({', '.join(objectives.RECIPE_DEFAULTS)})")
        require(abs(s_to_heads(cal.s, grid.width_unit, grid.head_dim) - grid.heads(cal.s)) < 1e-9,
                f"[calibrate] s = {cal.s:g} is not a whole number of heads; use s in steps of {grid.s_step:g}")
        config = grid.model(cal.s, cal.r)
        steps = tokens_for_budget(config, cal.budget, grid.batch_tokens) // grid.batch_tokens
        require(steps >= grid.min_steps, f"[calibrate] budget {cal.budget:.3g} FLOPs buys {steps} optimizer steps "
                                         f"at s={cal.s:g}, fewer than min_steps={grid.min_steps}")
        return cal


@dataclass(frozen=True)
class Training:
    """What a trained trial reads: ``[data]``, ``[recipe]`` (objectives' defaults when the sweep trains and
    leaves them out), the held-out tokens, and the optional ``[calibrate]`` stage."""

    val_tokens: int
    data: dict[str, Any] | None
    recipe: dict[str, Any] | None
    calibrate: Calibration | None = None

    @classmethod
    def parse(cls, t: Table, raw: dict[str, Any], uses_data: bool, template: dict[str, Any]) -> "Training":
        """The keys as given; with ``uses_data`` (the sweep trains) the tables are filled with objectives'
        defaults (KJV bytes) and checked."""
        training = cls(val_tokens=t.int("val_tokens", default=1_048_576),
                       data=t.table("data") if "data" in raw else None,
                       recipe=t.table("recipe") if "recipe" in raw else None)
        require(training.val_tokens >= 1, f"val_tokens must be >= 1, got {training.val_tokens}")
        if not uses_data:  # [data] and [recipe] are never read
            return training
        data, recipe = training.data or {}, training.recipe or {}
        if data.get("tokenizer") == "bpe" and "tokenizer_vocab" not in data:  # the template's vocabulary
            data = {**data, "tokenizer_vocab": int(iso_depth_template(template)["vocab_size"])}
        return dataclasses.replace(training, data=data, recipe=recipe)

@dataclass(frozen=True)
class Rungs:
    """``[validate]``: budgets above the sweep's largest at which the sweep ends by training the compute-optimal
    model of its fitted law, per r, and comparing it with the law's prediction (search/validate.py). Never hashed:
    the rungs run after the sweep and change none of its trials, so a finished sweep resumed with rungs added
    trains them."""

    budgets: tuple[float, ...] = field(default=(), metadata=AFTER_SWEEP)

    @classmethod
    def parse(cls, t: Table, grid: Grid) -> "Rungs":
        table = Table(t.table("validate"), "[validate]", ("budgets",))
        listed = table.raw.get("budgets")  # an empty list drops a preset's rungs (--set 'validate.budgets=[]')
        budgets = () if listed == [] else tuple(float(b) for b in table.list("budgets", (int, float)) or ())
        require(len(set(budgets)) == len(budgets), "[validate] budgets has duplicates")
        cls.check(grid, budgets, "[validate] budget")
        return cls(budgets=budgets)

    @staticmethod
    def finite(budgets, what: str) -> None:
        """One line for a rung budget that is no FLOP count (inf, nan): the check that needs no sweep."""
        for budget in budgets:
            require(math.isfinite(budget), f"{what} {budget:g} is not a FLOP count: a rung trains a model of a finite "
                                           "budget")

    @staticmethod
    def check(grid: Grid, budgets, what: str) -> None:
        """One line for a rung budget not above the grid's largest, or one that trains fewer than min_steps
        steps even at the narrowest width (the cheapest per token: if it does, every width does)."""
        Rungs.finite(budgets, what)
        top = max(grid.budgets)
        for budget in budgets:
            require(budget > top,
                    f"{what} {budget:.3g} FLOPs is not above the sweep's largest budget {top:.3g}: a rung checks "
                    "the law beyond the budgets it was fitted on")
            for r in grid.recurrences:
                config = grid.model(heads_to_s(1, grid.width_unit, grid.head_dim), r)
                steps = tokens_for_budget(config, budget, grid.batch_tokens) // grid.batch_tokens
                require(steps >= grid.min_steps,
                        f"{what} {budget:.3g} FLOPs buys {steps} optimizer steps of {grid.batch_tokens} tokens at "
                        f"r={r} even at the narrowest width, fewer than min_steps={grid.min_steps}")


@dataclass(frozen=True)
class Sensitivity:
    """``rate_sensitivity = true``: the sweep ends by training each search cell's best width again at its rate x 1/2
    and x 2 (search/rate_sensitivity.py), and ``loopscale analyze`` reports how phi and the gaps to r = 1 move
    (analysis/rate_sensitivity.py). Never hashed: its stages run after the search and change none of its trials."""

    factors: tuple[float, ...] = field(default=(), metadata=AFTER_SWEEP)

    @classmethod
    def parse(cls, t: Table, objective: str) -> "Sensitivity":
        if not t.bool("rate_sensitivity", default=False):
            return cls()
        require(objective == "train", "rate_sensitivity = true needs objective = \"train\": a simulated trial has "
                                      "no learning rate")
        return cls(factors=RATE_FACTORS)

    def stages(self) -> list[tuple[str, float]]:
        """(stage name, rate factor) of each of its stages."""
        return [(stage_name(f), f) for f in self.factors]


@dataclass(frozen=True)
class Placement:
    """``[resources]`` and the stores: where trials run and log. Only a trial's CPUs and GPUs are part of the
    design (they decide a trained trial's device and threads); the rest may change between resumes."""

    cpus_per_trial: float
    gpus_per_trial: float
    # data-parallel workers of one training trial, each with cpus_per_trial and gpus_per_trial
    workers: int = field(metadata=PLACEMENT)
    max_concurrent: int | None = field(metadata=PLACEMENT)
    retries: int = field(metadata=PLACEMENT)
    checkpoint_s: float = field(metadata=PLACEMENT)  # seconds of training between a trial's checkpoints; 0 = none
    keep_models: str = field(metadata=PLACEMENT)  # whose trained weights MLflow keeps (search/tune/keep.py)
    tracking_uri: str = field(metadata=PLACEMENT)
    storage: str = field(metadata=PLACEMENT)
    cache_dir: str = field(metadata=PLACEMENT)
    address: str | None = field(metadata=PLACEMENT)

    @classmethod
    def parse_resources(cls, t: Table) -> dict[str, Any]:
        """``[resources]``, checked; the stores follow in ``parse`` (their keys are read after the others')."""
        res = Table(t.table("resources"), "[resources]", ("cpus", "gpus", "workers", "max_concurrent", "retries",
                                                          "checkpoint_s", "keep_models"))
        cpus, gpus = res.number("cpus", default=1), res.number("gpus", default=0)
        require(cpus > 0 and gpus >= 0, f"[resources] needs cpus > 0 and gpus >= 0, got cpus={cpus}, gpus={gpus}")
        for key, amount in (("cpus", cpus), ("gpus", gpus)):  # Ray refuses finer amounts once it runs the trial
            units = amount / RAY_RESOURCE_UNIT
            require(abs(units - round(units)) < 1e-6 and (amount == 0 or round(units) >= 1),
                    f"[resources] {key} = {amount:g}: Ray counts resources in steps of {RAY_RESOURCE_UNIT:g}")
        max_concurrent = res.int("max_concurrent")
        require(max_concurrent is None or max_concurrent >= 1, "[resources] max_concurrent must be >= 1")
        workers = res.int("workers", default=1)
        require(workers >= 1, f"[resources] workers must be >= 1, got {workers}")
        retries = res.int("retries", default=2)
        require(retries >= 0, f"[resources] retries must be >= 0, got {retries}")
        checkpoint_s = res.number("checkpoint_s", default=DEFAULT_CHECKPOINT_S)
        require(checkpoint_s >= 0, f"[resources] checkpoint_s must be >= 0 seconds (0 = no checkpoints), got "
                                   f"{checkpoint_s}")
        keep_models = res.str("keep_models", default="best")
        require(keep_models in KEEP_MODELS, f"[resources] keep_models must be one of "
                                            f"{', '.join(repr(k) for k in KEEP_MODELS)}, got {keep_models!r}")
        return {"cpus_per_trial": float(cpus), "gpus_per_trial": float(gpus), "workers": workers,
                "max_concurrent": max_concurrent, "retries": retries, "checkpoint_s": float(checkpoint_s),
                "keep_models": keep_models}

    @classmethod
    def parse(cls, t: Table, resources: dict[str, Any]) -> "Placement":
        return cls(**resources,
                   tracking_uri=resolve_tracking_uri(t.str("tracking_uri")),  # the flag, if any, is already in raw
                   storage=_absolute(t.str("storage") or str(Path(DEFAULT_RUN_DIR) / "tune")),
                   cache_dir=_absolute(t.str("cache_dir") or str(Path(DEFAULT_RUN_DIR) / "cache")),
                   address=t.str("address") or None)


def _architecture(template: Table, folder: Path) -> dict[str, Any]:
    """``[template] architecture`` (a file's path made absolute against ``folder``, the spec's) and
    ``[template.options]``, each only when it differs from the built-in's default, so that a spec which leaves them
    out, or names the built-in, keeps its hash; the factory must load (one line naming it, else)."""
    name = template.str("architecture", default=BUILTIN)
    options = template.table("options")
    if name == BUILTIN and not options:
        return {}
    from loopscale.model import architecture  # torch: only a spec that names an architecture pays for it

    name = architecture.resolve(name, folder)
    architecture.factory(name)
    return {"architecture": name, **({"options": options} if options else {})}


def _law(table: dict[str, Any]) -> dict[str, float]:
    """``[simulate] law``: L = E + A (N_once + r^phi N_rec)^-alpha + B D^-beta (model/law.py), with positive A,
    alpha, B, beta (a negative one fails every trial: it takes log L); E may be negative, which fails the trials
    of the models whose L then is (the search tests' way to fail some trials); {} = absent."""
    if not table:
        return {}
    t = Table(table, "[simulate] law", LAW_CONSTANTS)
    law = {k: float(t.number(k, required=True)) for k in LAW_CONSTANTS}
    for k in ("A", "alpha", "B", "beta"):
        require(law[k] > 0, f"[simulate] law needs {k} > 0, got {k} = {law[k]:g}")
    return law


def _absolute(path: str) -> str:
    """Local paths become absolute (trials run in other directories); URIs (s3://, gs://) pass through."""
    return path if "://" in path else str(Path(path).expanduser().resolve())
