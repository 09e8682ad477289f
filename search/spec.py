"""The sweep spec: one TOML file that says what to search, how, and where to log it.

``SweepSpec.from_toml(path)`` reads and validates it; every mistake is ONE ``ValueError`` line, raised before
anything is written or Ray starts. A spec describes a grid of cells (FLOP budget C x recurrences r); in each
cell the search looks for the compute-optimal width s, and the tokens follow from the budget,
``D = C / F(s, r)`` in whole optimizer steps (``model.tokens_for_budget``).

Layout (every key optional unless marked)::

    name = "demo"                    # required; the MLflow experiment and the Tune run name
    objective = "train"              # "train" | "simulate"
    seed = 0
    budgets = [1e11, 3e11, 1e12]     # required; FLOPs per trial
    recurrences = [1, 2, 4]          # required; every r must divide the shared depth
    seq_len = 128
    batch_tokens = 4096              # tokens per optimizer step
    val_tokens = 65536               # held-out tokens, the same for every trial (train)
    trials_per_cell = 5
    sampler = "gp"                   # "gp" | "tpe" | "grid" | "random"
    min_steps = 10                   # a width needs at least this many optimizer steps in its cell
    first_guess_tokens_per_param = 20
    tracking_uri = "sqlite:///..."   # default sqlite:///<cwd>/loopscale-runs/mlflow.db
    storage = "./loopscale-runs/tune"
    cache_dir = "./loopscale-runs/cache"
    address = ""                     # an existing Ray cluster; empty = local (RAY_ADDRESS also works)

    [template]    # LoopedConfig.iso_depth keywords: depth prelude coda width_unit head_dim injection bptt_k vocab_size
    [widths]      # s_min, s_max (required), tokens_per_param = [lo, hi] (optional window per cell)
    [simulate]    # noise (nats, default 0.01), law = {E, A, alpha, B, beta, phi} (default: the paper's fit);
                  # testing aids (objectives/simulate.py): delay_s, journal = "path.jsonl", rendezvous = N,
                  # faults = {"C=1e+12,r=1/s=4" = "raise" | "nan" | "sigkill" | "exit", optionally "...-once"}
    [data]        # objectives' data source and tokenizer (train)
    [recipe]      # objectives' training recipe (train)
    [calibrate]   # optional lr calibration: budget, s, r, trials, low, high, param
    [resources]   # cpus, gpus per trial; max_concurrent; retries

Widths: ``width = width_unit * s`` must be a multiple of ``head_dim``, so s moves in steps of
``head_dim / width_unit`` (2 in the paper: 64 * s rounded to 128). A cell keeps the widths that take at least
``min_steps`` optimizer steps and, if a ``tokens_per_param`` window is given, whose D / N lies in it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import hashlib
import json
import math
import os
import sqlite3
import sys
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from loopscale import objectives
from loopscale.model import INJECTIONS, JointLaw, LoopedConfig, count_params, tokens_for_budget
from loopscale.objectives.simulate import FAULT_ONCE, FAULTS

OBJECTIVES = ("train", "simulate")
SAMPLERS = ("gp", "tpe", "grid", "random")
STAGES = ("calibrate", "search")
PRESET_NAMES = ("smoke", "demo", "paper")
TEMPLATE_KEYS = ("depth", "prelude", "coda", "width_unit", "head_dim", "injection", "bptt_k", "vocab_size")
DEFAULT_RUN_DIR = "loopscale-runs"
DEFAULT_NOISE = 0.01
MAX_WIDTHS = 1000  # whole-head widths in [s_min, s_max]: each is sized per cell while parsing
MAX_SEED = 2**63 - 1  # torch.manual_seed's limit


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


@dataclass(frozen=True)
class Cell:
    """One (budget, r) cell of a stage: the widths it may try and how many trials it gets."""

    stage: str
    budget: float
    r: int
    widths: tuple[float, ...]  # feasible s, ascending, one per width (head_dim apart)
    first_guess: float
    n_trials: int

    @property
    def key(self) -> str:
        return cell_key(self.budget, self.r)


def cell_key(budget: float, r: int) -> str:
    """The cell's name in tags and tables, e.g. ``C=1e+18,r=4``."""
    return f"C={budget:.3g},r={r}"


@dataclass(frozen=True)
class SweepSpec:
    name: str
    objective: str
    budgets: tuple[float, ...]
    recurrences: tuple[int, ...]
    template: dict[str, Any]
    s_min: float
    s_max: float
    tokens_per_param: tuple[float, float] | None
    seq_len: int
    batch_tokens: int
    val_tokens: int
    trials_per_cell: int
    sampler: str
    seed: int
    min_steps: int
    first_guess_tokens_per_param: float
    noise: float
    law: dict[str, float] | None
    data: dict[str, Any] | None
    recipe: dict[str, Any] | None
    calibrate: Calibration | None
    cpus_per_trial: float
    gpus_per_trial: float
    max_concurrent: int | None
    retries: int
    tracking_uri: str
    storage: str
    cache_dir: str
    address: str | None
    source: str = field(default="", compare=False)  # where it was read from, for messages
    text: str = field(default="", compare=False, repr=False)  # the TOML as written, for the artifact
    # [simulate] testing aids (objectives/simulate.py); faults maps "<cell key>/s=<s>" to an action
    delay_s: float = 0.0
    journal: str | None = None
    rendezvous: int = 0
    faults: dict[str, str] | None = None

    # ---- reading -------------------------------------------------------------------------------------
    @classmethod
    def from_toml(cls, path: str | os.PathLike, **overrides: Any) -> "SweepSpec":
        """Read and validate a spec file (or a preset name: smoke, demo, paper).

        ``overrides`` replace top-level keys before validation (the CLI's ``--objective``,
        ``--tracking-uri``, ``--address``); ``None`` values are ignored.
        """
        file = resolve_spec_path(path)
        try:
            text = file.read_text(encoding="utf-8")
            raw = tomllib.loads(text)
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{file}: not valid TOML: {exc}") from None
        raw.update({k: v for k, v in overrides.items() if v is not None})
        if overrides.get("objective") == "simulate":
            raw.pop("calibrate", None)  # replaying with the law: nothing trains, so no rate to calibrate
        try:
            return cls.from_dict(raw, source=str(file), text=text)
        except ValueError as exc:
            raise ValueError(f"{file.name}: {exc}") from None

    @classmethod
    def from_dict(cls, raw: dict[str, Any], *, source: str = "<dict>", text: str = "") -> "SweepSpec":
        """Validate a parsed spec; relative paths are resolved against the current directory."""
        t = _Table(raw, "top level", TOP_KEYS)
        name = t.str("name", required=True)
        _require(name.replace("-", "").replace("_", "").replace(".", "").isalnum(),
                 f"name {name!r} may use only letters, digits, '-', '_' and '.'")
        objective = t.choice("objective", OBJECTIVES, "train")
        budgets = tuple(float(b) for b in t.list("budgets", (int, float), required=True))
        _require(all(b > 0 and math.isfinite(b) for b in budgets), "budgets must be positive finite FLOP counts")
        _require(len(set(budgets)) == len(budgets), "budgets has duplicates")
        recurrences = tuple(t.list("recurrences", (int,), required=True))
        _require(all(r >= 1 for r in recurrences), "recurrences must be >= 1")
        _require(len(set(recurrences)) == len(recurrences), "recurrences has duplicates")

        template_table = _Table(t.table("template"), "[template]", TEMPLATE_KEYS)
        template = {k: template_table.raw[k] for k in TEMPLATE_KEYS if k in template_table.raw}
        for key in ("depth", "prelude", "coda", "width_unit", "head_dim", "vocab_size"):
            template_table.int(key)
        template_table.str("injection")
        template_table.int("bptt_k")
        for key in ("width_unit", "head_dim", "bptt_k"):  # the width step divides by the first two
            _require(template.get(key, 1) >= 1, f"{key} in [template] must be >= 1, got {template.get(key)}")
        injection = template.get("injection", "linear")  # checked here too: an r = 1 model ignores it
        _require(injection in INJECTIONS, f"injection in [template] must be one of {', '.join(INJECTIONS)}, "
                                          f"got {injection!r}")

        widths = _Table(t.table("widths", required=True), "[widths]", ("s_min", "s_max", "tokens_per_param"))
        s_min, s_max = widths.number("s_min", required=True), widths.number("s_max", required=True)
        _require(0 < s_min <= s_max, f"[widths] needs 0 < s_min <= s_max, got s_min={s_min}, s_max={s_max}")
        tpp = widths.list("tokens_per_param", (int, float))
        if tpp is not None:
            _require(len(tpp) == 2 and 0 < tpp[0] < tpp[1],
                     f"[widths] tokens_per_param must be [low, high] with 0 < low < high, got {tpp}")
            tpp = (float(tpp[0]), float(tpp[1]))

        sim = _Table(t.table("simulate"), "[simulate]", ("noise", "law", "delay_s", "journal", "rendezvous",
                                                                "faults"))
        delay_s = sim.number("delay_s", default=0.0)
        _require(0 <= delay_s < math.inf, f"[simulate] delay_s must be >= 0 seconds, got {delay_s}")
        journal = sim.str("journal")
        rendezvous = sim.int("rendezvous", default=0)
        _require(rendezvous >= 0, f"[simulate] rendezvous must be >= 0 trials, got {rendezvous}")
        _require(rendezvous <= 1 or journal is not None, "[simulate] rendezvous needs [simulate] journal to count "
                 "the trials that started")
        noise = sim.number("noise", default=DEFAULT_NOISE)
        _require(noise >= 0, f"[simulate] noise must be >= 0 nats, got {noise}")
        law = sim.table("law") or None
        if law is not None:
            try:
                JointLaw(**{k: float(v) for k, v in law.items()})
            except (TypeError, ValueError) as exc:
                raise ValueError(f"[simulate] law needs exactly E, A, alpha, B, beta, phi as numbers: {exc}") from None
            law = {k: float(v) for k, v in law.items()}

        data = t.table("data") if "data" in raw else None
        recipe = t.table("recipe") if "recipe" in raw else None
        res = _Table(t.table("resources"), "[resources]", ("cpus", "gpus", "max_concurrent", "retries"))
        cpus, gpus = res.number("cpus", default=1), res.number("gpus", default=0)
        _require(cpus > 0 and gpus >= 0, f"[resources] needs cpus > 0 and gpus >= 0, got cpus={cpus}, gpus={gpus}")
        max_concurrent = res.int("max_concurrent")
        _require(max_concurrent is None or max_concurrent >= 1, "[resources] max_concurrent must be >= 1")
        retries = res.int("retries", default=2)
        _require(retries >= 0, f"[resources] retries must be >= 0, got {retries}")

        spec = cls(
            name=name, objective=objective, budgets=budgets, recurrences=recurrences, template=template,
            s_min=float(s_min), s_max=float(s_max), tokens_per_param=tpp,
            seq_len=t.int("seq_len", default=2048), batch_tokens=t.int("batch_tokens", default=262_144),
            val_tokens=t.int("val_tokens", default=1_048_576), trials_per_cell=t.int("trials_per_cell", default=5),
            sampler=t.choice("sampler", SAMPLERS, "gp"), seed=t.int("seed", default=0),
            min_steps=t.int("min_steps", default=10),
            first_guess_tokens_per_param=float(t.number("first_guess_tokens_per_param", default=20)),
            noise=float(noise), law=law, data=data, recipe=recipe, calibrate=None,
            cpus_per_trial=float(cpus), gpus_per_trial=float(gpus), max_concurrent=max_concurrent,
            retries=retries,
            tracking_uri=t.str("tracking_uri") or default_tracking_uri(),
            storage=_absolute(t.str("storage") or str(Path(DEFAULT_RUN_DIR) / "tune")),
            cache_dir=_absolute(t.str("cache_dir") or str(Path(DEFAULT_RUN_DIR) / "cache")),
            address=t.str("address") or None, source=source, text=text, delay_s=float(delay_s),
            journal=_absolute(journal) if journal else None, rendezvous=rendezvous,
        )
        for key in ("seq_len", "batch_tokens", "val_tokens", "trials_per_cell", "min_steps"):
            _require(getattr(spec, key) >= 1, f"{key} must be >= 1, got {getattr(spec, key)}")
        _require(0 <= spec.seed <= MAX_SEED, f"seed must be in [0, 2**63 - 1], got {spec.seed}")
        _require(spec.first_guess_tokens_per_param > 0, "first_guess_tokens_per_param must be positive")
        uses_data = objective == "train" or bool(t.table("calibrate"))  # else [data] and [recipe] are never read
        if uses_data:  # absent tables mean objectives' defaults (KJV bytes)
            data, recipe = data or {}, recipe or {}
            if data.get("tokenizer") == "bpe" and "tokenizer_vocab" not in data:  # the template's vocabulary
                data = {**data, "tokenizer_vocab": int(template.get("vocab_size", _ISO_DEFAULTS["vocab_size"]))}
            spec = dataclasses.replace(spec, data=data, recipe=recipe)
            _require(spec.batch_tokens % spec.seq_len == 0,
                     f"batch_tokens {spec.batch_tokens} must be a whole number of sequences of seq_len {spec.seq_len}")
            objectives.validate_data(data)
            objectives.validate_recipe(recipe)
        spec = dataclasses.replace(spec, template={**template, "vocab_size": spec._vocab_size(uses_data)})
        spec._check_shapes()
        spec = dataclasses.replace(spec, calibrate=_calibration(t.table("calibrate"), spec))
        spec.cells()  # every cell must have a width that trains
        spec = dataclasses.replace(spec, faults=_faults(sim.table("faults"), spec))
        check_tracking_uri(spec.tracking_uri)
        return spec

    # ---- derived -------------------------------------------------------------------------------------
    @property
    def s_step(self) -> float:
        """s moves in steps of head_dim / width_unit so that every width is a multiple of head_dim."""
        return self.head_dim / self.width_unit

    @property
    def head_dim(self) -> int:
        return int(self.template.get("head_dim", _ISO_DEFAULTS["head_dim"]))

    @property
    def width_unit(self) -> int:
        return int(self.template.get("width_unit", _ISO_DEFAULTS["width_unit"]))

    def model_template(self) -> dict[str, Any]:
        """Keyword arguments of ``LoopedConfig.iso_depth`` other than s and r (the trial config's template)."""
        return {**self.template, "seq_len": self.seq_len}

    def model(self, s: float, r: int) -> LoopedConfig:
        return LoopedConfig.iso_depth(s, r, **self.model_template())

    def s_values(self) -> tuple[float, ...]:
        """Every s in [s_min, s_max] whose width is a whole number of heads."""
        lo, hi = _heads(self.s_min, self), _heads(self.s_max, self)
        return tuple(h * self.s_step for h in range(lo, hi + 1))

    def cells(self, stage: str = "search") -> list[Cell]:
        """The cells of a stage in a fixed order (budget, then r); calibration has one cell."""
        if stage == "calibrate":
            c = self.calibrate
            if c is None:
                return []
            return [Cell("calibrate", c.budget, c.r, (c.s,), c.s, c.trials)]
        return [self._cell(budget, r) for budget in self.budgets for r in self.recurrences]

    def _cell(self, budget: float, r: int) -> Cell:
        feasible: dict[float, float] = {}  # s -> tokens per parameter
        for s in self.s_values():
            config = self.model(s, r)
            tokens = tokens_for_budget(config, budget, self.batch_tokens)
            if tokens // self.batch_tokens < self.min_steps:
                _require(s > self.s_min, f"budget {budget:.3g} FLOPs buys fewer than min_steps={self.min_steps} "
                                         f"optimizer steps of {self.batch_tokens} tokens even at the narrowest "
                                         f"width (s={s:g}, r={r}); raise the budget or lower batch_tokens")
                break  # wider models only cost more per token
            tpp = tokens / count_params(config).N
            if self.tokens_per_param is None or self.tokens_per_param[0] <= tpp <= self.tokens_per_param[1]:
                feasible[s] = tpp
        _require(bool(feasible), f"no width in [widths] puts budget {budget:.3g} FLOPs (r={r}) inside "
                                 f"tokens_per_param {list(self.tokens_per_param or ())}; widen [widths]")
        target = math.log(self.first_guess_tokens_per_param)
        guess = min(feasible, key=lambda s: abs(math.log(feasible[s]) - target))
        return Cell("search", budget, r, tuple(feasible), guess, min(self.trials_per_cell, len(feasible)))

    def planned_trials(self) -> int:
        return sum(c.n_trials for stage in STAGES for c in self.cells(stage))

    def trial_config(self, cell: Cell, s: float, recipe: dict[str, Any] | None = None) -> dict[str, Any]:
        """The trial config (objectives/trial.py) of width s in ``cell``; ``recipe`` overrides the spec's."""
        objective = "train" if cell.stage == "calibrate" else self.objective
        config: dict[str, Any] = {
            "budget_flops": cell.budget, "r": cell.r, "s": float(s), "template": self.model_template(),
            "batch_tokens": self.batch_tokens, "seed": self.seed, "objective": objective,
        }
        if objective == "simulate":
            config.update(noise=self.noise, **({"law": dict(self.law)} if self.law else {}))
            prefix = f"{cell.key}/s="
            faults = {k.removeprefix(prefix): v for k, v in (self.faults or {}).items() if k.startswith(prefix)}
            aids = {"delay_s": self.delay_s, "journal": self.journal, "rendezvous": self.rendezvous, "faults": faults}
            config.update({k: v for k, v in aids.items() if v})  # absent unless asked for
        else:
            config.update(data=self.data, recipe=dict(recipe if recipe is not None else self.recipe),
                          device="cuda" if self.gpus_per_trial > 0 else "cpu",
                          num_threads=max(1, int(self.cpus_per_trial)), cache_dir=self.cache_dir,
                          val_tokens=self.val_tokens)
        return config

    def resources(self, stage: str) -> dict[str, float]:
        """Ray resources of one trial; a simulated trial needs one CPU whatever the spec asks of training."""
        if stage == "search" and self.objective == "simulate":
            return {"cpu": 1.0, "gpu": 0.0}
        return {"cpu": self.cpus_per_trial, "gpu": self.gpus_per_trial}

    def concurrency(self, stage: str, cpus_available: float) -> int:
        """Trials side by side: ``max_concurrent`` if given, else as many as the CPUs hold."""
        return self.max_concurrent or max(1, int(cpus_available // self.resources(stage)["cpu"]))

    def design(self) -> dict[str, Any]:
        """What the sweep measures: every field but where it runs and logs (those may move between resumes)."""
        skip = {"tracking_uri", "storage", "cache_dir", "address", "source", "text", "max_concurrent", "retries",
                "delay_s", "journal", "rendezvous"}
        design = {k: v for k, v in dataclasses.asdict(self).items() if k not in skip}
        if not design["faults"]:
            del design["faults"]  # so a spec without faults keeps the hash it had before they existed
        return design

    @property
    def spec_hash(self) -> str:
        blob = json.dumps(self.design(), sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    # ---- validation helpers ---------------------------------------------------------------------------
    def _vocab_size(self, uses_data: bool) -> int:
        """``[template] vocab_size`` if given (the paper pads its 32,000-token tokenizer to 32,064), else the data
        tokenizer's (when the sweep reads data), else ``iso_depth``'s default."""
        if "vocab_size" in self.template:
            return int(self.template["vocab_size"])
        if uses_data:
            return int(objectives.vocab_size_of(self.data))
        return _ISO_DEFAULTS["vocab_size"]

    def _check_shapes(self) -> None:
        for label, s in (("s_min", self.s_min), ("s_max", self.s_max)):
            width = self.width_unit * s
            _require(abs(width - round(width)) < 1e-9 and round(width) % self.head_dim == 0,
                     f"[widths] {label} = {s:g} gives width {width:g}, not a multiple of head_dim {self.head_dim}; "
                     f"use s in steps of {self.s_step:g}")
        count = _heads(self.s_max, self) - _heads(self.s_min, self) + 1
        _require(count <= MAX_WIDTHS, f"[widths] s_min..s_max spans {count} widths (s in steps of {self.s_step:g}), "
                                      f"more than {MAX_WIDTHS}; narrow it")
        for r in self.recurrences:
            self.model(self.s_min, r)  # raises the template's own one-line errors (r must divide the shared depth)


TOP_KEYS = (
    "name", "objective", "seed", "budgets", "recurrences", "seq_len", "batch_tokens", "val_tokens",
    "trials_per_cell", "sampler", "min_steps", "first_guess_tokens_per_param", "tracking_uri", "storage",
    "cache_dir", "address", "template", "widths", "simulate", "data", "recipe", "calibrate", "resources",
)
_ISO_DEFAULTS = {"head_dim": 128, "width_unit": 64, "vocab_size": 32064}


def _calibration(table: dict[str, Any], spec: SweepSpec) -> Calibration | None:
    """The calibration stage (it always trains: a simulated trial has no learning rate), or None."""
    if not table:
        return None
    t = _Table(table, "[calibrate]", ("budget", "s", "r", "trials", "low", "high", "param"))
    cal = Calibration(budget=float(t.number("budget", required=True)), s=float(t.number("s", required=True)),
                      r=t.int("r", default=1), trials=t.int("trials", default=6),
                      low=float(t.number("low", required=True)), high=float(t.number("high", required=True)),
                      param=t.str("param", default="base_lr"))
    _require(0 < cal.low < cal.high, f"[calibrate] needs 0 < low < high, got low={cal.low}, high={cal.high}")
    _require(cal.trials >= 1, "[calibrate] trials must be >= 1")
    _require(cal.budget > 0, "[calibrate] budget must be positive")
    _require(cal.param in objectives.RECIPE_DEFAULTS,
             f"[calibrate] param {cal.param!r} is not a recipe key ({', '.join(objectives.RECIPE_DEFAULTS)})")
    _require(abs(spec.width_unit * cal.s / spec.head_dim - _heads(cal.s, spec)) < 1e-9,
             f"[calibrate] s = {cal.s:g} is not a whole number of heads; use s in steps of {spec.s_step:g}")
    config = spec.model(cal.s, cal.r)
    steps = tokens_for_budget(config, cal.budget, spec.batch_tokens) // spec.batch_tokens
    _require(steps >= spec.min_steps, f"[calibrate] budget {cal.budget:.3g} FLOPs buys {steps} optimizer steps at "
                                      f"s={cal.s:g}, fewer than min_steps={spec.min_steps}")
    return cal


def _faults(table: dict[str, Any], spec: SweepSpec) -> dict[str, str] | None:
    """``[simulate] faults``: each key ``"<cell key>/s=<s>"`` must name a width the cell may try, each value a
    fault of objectives/simulate.py (``-once`` needs the journal that remembers the first execution)."""
    if not table:
        return None
    _require(spec.objective == "simulate", "[simulate] faults apply to the simulated objective only")
    widths = {c.key: c.widths for c in spec.cells()}
    actions = (*FAULTS, *(f"{a}{FAULT_ONCE}" for a in FAULTS))
    faults = {}
    for selector, action in table.items():
        cell, _, s = selector.partition("/s=")
        _require(cell in widths, f"[simulate] faults: {selector!r} names no cell; use \"<cell>/s=<s>\" with a cell "
                                 f"of {', '.join(widths)}")
        try:
            width = float(s)
        except ValueError:
            raise ValueError(f"[simulate] faults: {selector!r} has no width after '/s='") from None
        _require(width in widths[cell], f"[simulate] faults: s={width:g} is not a width of cell {cell} "
                                        f"({', '.join(f'{w:g}' for w in widths[cell])})")
        _require(action in actions, f"[simulate] faults: {action!r} is not a fault; use {', '.join(actions)}")
        _require(not action.endswith(FAULT_ONCE) or spec.journal is not None,
                 f"[simulate] faults: {action!r} needs [simulate] journal to remember the first execution")
        faults[f"{cell}/s={width:g}"] = action
    return faults


def _heads(s: float, spec: SweepSpec) -> int:
    return round(spec.width_unit * s / spec.head_dim)


def default_tracking_uri() -> str:
    """The MLflow store of every sweep that names none: a sqlite file under ./loopscale-runs."""
    return f"sqlite:///{Path.cwd() / DEFAULT_RUN_DIR / 'mlflow.db'}"


def _absolute(path: str) -> str:
    """Local paths become absolute (trials run in other directories); URIs (s3://, gs://) pass through."""
    return path if "://" in path else str(Path(path).expanduser().resolve())


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _finite(value: int | float) -> bool:
    """A number a float can hold (TOML integers are unbounded here; ``float(10**400)`` overflows)."""
    return math.isfinite(value) if isinstance(value, float) else abs(value) <= sys.float_info.max


class _Table:
    """Typed access to one TOML table that rejects unknown keys up front."""

    def __init__(self, raw: Any, where: str, known: tuple[str, ...]):
        _require(isinstance(raw, dict), f"{where} must be a table")
        unknown = sorted(set(raw) - set(known))
        if unknown:
            close = difflib.get_close_matches(unknown[0], known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown key {unknown[0]!r} in {where}{hint}; known keys: {', '.join(known)}")
        self.raw, self.where = raw, where

    def _get(self, key: str, types: tuple[type, ...], default: Any, required: bool, kind: str) -> Any:
        if key not in self.raw:
            _require(not required, f"{self.where} needs {key!r}")
            return default
        value = self.raw[key]
        _require(isinstance(value, types) and not isinstance(value, bool),
                 f"{key} in {self.where} must be {kind}, got {value!r}")
        return value

    def str(self, key: str, default: str | None = None, required: bool = False) -> str | None:
        return self._get(key, (str,), default, required, "a string")

    def int(self, key: str, default: int | None = None, required: bool = False) -> int | None:
        return self._get(key, (int,), default, required, "an integer")

    def number(self, key: str, default: float | None = None, required: bool = False) -> float | None:
        value = self._get(key, (int, float), default, required, "a number")
        # TOML spells inf and nan; no setting means either (and inf would only fail later, inside a trial)
        _require(value is None or _finite(value), f"{key} in {self.where} must be a finite number, got {value!r}")
        return value

    def table(self, key: str, required: bool = False) -> dict[str, Any]:
        return self._get(key, (dict,), {}, required, "a table")

    def list(self, key: str, item_types: tuple[type, ...], required: bool = False) -> list | None:
        value = self._get(key, (list,), None, required, "a list")
        if value is not None:
            _require(len(value) > 0, f"{key} in {self.where} is empty")
            kind = "integers" if item_types == (int,) else "numbers"
            _require(all(isinstance(v, item_types) and not isinstance(v, bool) and _finite(v) for v in value),
                     f"{key} in {self.where} must be a list of finite {kind}, got {value!r}")
        return value

    def choice(self, key: str, options: tuple[str, ...], default: str) -> str:
        value = self.str(key, default)
        _require(value in options, f"{key} must be one of {', '.join(options)}, got {value!r}")
        return value


def resolve_spec_path(spec: str | os.PathLike) -> Path:
    """A spec file path, or a preset shipped with the package (``smoke``, ``demo``, ``paper``)."""
    path = Path(spec)
    if path.is_file():
        return path
    if str(spec) in PRESET_NAMES:
        return Path(str(resources.files("loopscale.search") / "presets" / f"{spec}.toml"))
    raise ValueError(f"no spec file {str(spec)!r} (presets: {', '.join(PRESET_NAMES)})")


def redact_uri(uri: str) -> str:
    """The URI with any password replaced by ``***`` (safe to print or log)."""
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _check_sqlite_store(path: Path) -> None:
    """An existing store must be an SQLite database, empty or MLflow's; otherwise MLflow fails deep inside
    SQLAlchemy with a traceback (a corrupted file), or adds its tables to some other program's database.
    Opened read-only: the check writes nothing."""
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error as exc:
        raise ValueError(f"tracking database {path} is not a readable SQLite database: {exc}") from None
    _require(not tables or {"experiments", "runs"} <= tables,
             f"tracking database {path} is an SQLite database but not MLflow's (no experiments and runs tables)")


def check_tracking_uri(uri: str, timeout_s: float = 5.0) -> None:
    """Fail with one line when MLflow could not log to ``uri``: a sqlite file in a place that cannot be written,
    an HTTP server that does not answer ``/health``, or a scheme loopscale does not support. Writes nothing."""
    scheme = urllib.parse.urlsplit(uri).scheme
    shown = redact_uri(uri)
    if scheme == "sqlite":
        db = uri.removeprefix("sqlite:///")
        _require(db not in ("", ":memory:") and uri.startswith("sqlite:///"),
                 f"tracking_uri {shown!r} must name a database file, e.g. sqlite:////abs/path/mlflow.db")
        target = Path(db)
        if target.exists():
            _require(target.is_file() and os.access(target, os.R_OK | os.W_OK),
                     f"tracking database {db} is not a readable and writable file")
            _check_sqlite_store(target)
            return
        parent = target.parent
        while not parent.exists():
            parent = parent.parent
        _require(parent.is_dir() and os.access(parent, os.W_OK),
                 f"tracking database {db} cannot be created: {parent} is not writable")
    elif scheme in ("http", "https"):
        bare = urllib.parse.urlsplit(uri)._replace(netloc=urllib.parse.urlsplit(uri).netloc.rpartition("@")[2])
        try:  # credentials travel in MLFLOW_TRACKING_USERNAME/PASSWORD, not in the health check
            with urllib.request.urlopen(bare.geturl().rstrip("/") + "/health", timeout=timeout_s) as reply:
                _require(reply.status == 200, f"tracking server {shown} answered /health with HTTP {reply.status}")
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ValueError(f"tracking server {shown} is unreachable: {reason}") from None
    else:
        raise ValueError(f"tracking_uri {shown!r}: use sqlite:///path/to/mlflow.db or an http(s):// MLflow server")
