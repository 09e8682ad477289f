"""The sweep spec: one TOML file that says what to search, how, and where to log it.

``SweepSpec.from_toml(path)`` reads and validates it; every mistake is ONE ``ValueError`` line, raised before
anything is written or Ray starts. Its parts, one per idea, are search/spec_parts.py's; the cells it describes are
search/space.py's; the typed TOML access is search/toml_table.py's; the store check is analysis/store.py's.

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
    sampler = "gp"                   # "law" (search/law_sampler.py; the presets') | "gp" | "tpe" | "grid" | "random"
    tolerance = 0.1                  # law sampler: a cell stops once its optimum is located this well (log width)
    branches = false                 # law sampler: trials also record warmdown branches in the next smaller cell
                                     # (objectives/branches.py; a train objective needs recipe.schedule = "wsd")
    information = 0                  # law sampler: a located cell takes another width while that trial's share of
                                     # var(phi) removed is >= information x its share of the fewest trials' FLOPs
                                     # (search/law_sampler.py); 0 = off
    deferred_budgets = 1             # law sampler with branches: budgets just below each r's largest that take no
                                     # trial of their own until the larger cells' branches have reached them (a
                                     # cheaper budget of the r always takes its first trial; 0 = none wait)
    rounds = true                    # propose in rounds: a round's trials all end before the next round is
                                     # proposed, their results told in a fixed order (search/tune/cells.py), so
                                     # the design does not depend on which trial finishes first (default: true
                                     # for the law, gp and tpe samplers, whose proposals read results)
    seeds = "shared"                 # "shared": every trial trains from `seed` (initialisation) and [data] seed
                                     # (batch order); "per_trial": each trial from its own seed, derived from
                                     # `seed` and the trial's key, so the seed's effect shows in phi's interval
    min_steps = 10                   # a width needs at least this many optimizer steps in its cell
    rate_sensitivity = false         # train: the sweep ends by training each cell's best width at its rate x 1/2
                                     # and x 2; analyze reports how phi and the gaps to r = 1 move with the rate
    first_guess_tokens_per_param = 20
    tracking_uri = "sqlite:///..."   # default $MLFLOW_TRACKING_URI, else sqlite:///<cwd>/loopscale-runs/mlflow.db
    storage = "./loopscale-runs/tune"
    cache_dir = "./loopscale-runs/cache"
    address = ""                     # an existing Ray cluster; empty = local (RAY_ADDRESS also works)

    [template]    # LoopedConfig.iso_depth keywords: depth prelude coda width_unit head_dim injection bptt_k lanes
                  # vocab_size (injection: linear | additive | none | hyperconnect, with lanes = K);
                  # architecture = "package.module:factory" | "path/to/file.py:factory" (relative to this file;
                  # default "loopscale:looped", the built-in LoopedLM: model/architecture.py), and
    [template.options]  # keyword arguments of that factory
    [widths]      # s_min, s_max (required), tokens_per_param = [lo, hi] (optional window per cell)
    [simulate]    # noise, cell_noise, misspec (nats; defaults objectives.noise.Noise), law = {E, A, alpha, B, beta,
                  # phi} (default: the paper's fit)
    [data]        # objectives' data source and tokenizer (train)
    [recipe]      # objectives' training recipe (train)
    [calibrate]   # optional lr calibration: budget, s, r, trials, low, high, param
    [validate]    # budgets = [...]: rungs above the largest budget; the sweep ends by training its law's
                  # compute-optimal model there per r and comparing (search/validate.py)
    [resources]   # cpus, gpus per trial (per worker); workers per trial (data-parallel); max_concurrent; retries;
                  # checkpoint_s: seconds of training between a trial's checkpoints (default 1800; 0 = none),
                  # from which a killed trial resumes exactly (objectives/checkpoint.py); keep_models: "best"
                  # (default: each cell's best trial), "all" or "none", the trained weights MLflow keeps
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from loopscale import objectives
from loopscale.analysis.store import check_store
from loopscale.objectives import testing
from loopscale.objectives.trial import OBJECTIVES

from . import space
from .overrides import apply_sets, effective_text
from .preflight import check_folder
from .space import STAGES, Cell
from .spec_parts import Calibration, Grid, Placement, Rungs, Sampling, Sensitivity, Simulation, Training, hashed
from .toml_table import Table, require

PRESET_NAMES = ("smoke", "demo", "paper")
MAX_NAME = 128


@dataclass(frozen=True)
class SweepSpec:
    """A validated spec: its name and objective, and one part per idea (search/spec_parts.py)."""

    name: str
    objective: str
    grid: Grid
    sampling: Sampling
    simulation: Simulation
    training: Training
    placement: Placement
    rungs: Rungs = field(default_factory=Rungs)  # [validate]: the rungs the sweep ends with (search/validate.py)
    # rate_sensitivity: each cell's best width trained again at other rates (search/rate_sensitivity.py)
    sensitivity: Sensitivity = field(default_factory=Sensitivity)
    source: str = field(default="", compare=False)  # where it was read from, for messages
    # the folder its relative paths ([template] architecture) were resolved against: the spec file's
    folder: str = field(default="", compare=False)
    text: str = field(default="", compare=False, repr=False)  # the TOML as written, for the artifact
    # the [testing] table of loopscale's own tests (objectives/testing.py); not part of the design or its hash
    testing: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # ---- reading -------------------------------------------------------------------------------------
    @classmethod
    def from_toml(cls, path: str | os.PathLike, sets: tuple[str, ...] | list[str] = (),
                  **overrides: Any) -> "SweepSpec":
        """Read and validate a spec file (or a preset name: smoke, demo, paper).

        ``sets`` are the CLI's ``--set key=value`` items (``search.overrides``), applied to the file's keys
        before validation. ``overrides`` replace top-level keys before validation (the CLI's ``--objective``,
        ``--tracking-uri``, ``--address``); ``None`` values are ignored.
        """
        file = resolve_spec_path(path)
        try:
            text = file.read_text(encoding="utf-8")
            raw = tomllib.loads(text)
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{file}: not valid TOML: {exc}") from None
        except RecursionError:  # tomllib parses nested arrays and inline tables by recursion
            raise ValueError(f"{file}: not valid TOML: its arrays or tables nest too deeply") from None
        raw = apply_sets(raw, sets)
        text = effective_text(text, raw, sets)
        raw.update({k: v for k, v in overrides.items() if v is not None})
        if overrides.get("objective") == "simulate":
            raw.pop("calibrate", None)  # replaying with the law: nothing trains, so no rate to calibrate
        try:
            return cls.from_dict(raw, source=str(file), text=text)
        except ValueError as exc:
            raise ValueError(f"{file.name}: {exc}") from None

    @classmethod
    def from_dict(cls, raw: dict[str, Any], *, source: str = "<dict>", text: str = "",
                  folder: str | os.PathLike | None = None) -> "SweepSpec":
        """Validate a parsed spec. A relative architecture file is resolved against ``folder`` (default: the
        folder of the file ``source`` names, else the current directory), a relative storage or cache against
        the current directory. Each part checks its own keys; the checks across parts follow."""
        t = Table({k: v for k, v in raw.items() if k != "testing"}, "top level", TOP_KEYS)
        name = t.str("name", required=True)
        require(name.replace("-", "").replace("_", "").replace(".", "").isalnum(),
                 f"name {name!r} may use only letters, digits, '-', '_' and '.'")
        # the printed `loopscale analyze --experiment NAME` must parse: a leading '-' reads as an option
        require(name[0].isalnum(), f"name {name!r} must start with a letter or a digit")
        # it names folders (with Tune's suffixes) and files, whose names a file system caps at 255 bytes
        require(len(name.encode()) <= MAX_NAME, f"name is {len(name.encode())} bytes long; keep it to {MAX_NAME}")
        objective = t.choice("objective", OBJECTIVES, "train")
        folder = Path(folder) if folder else Path(source).parent if Path(source).is_file() else Path.cwd()
        grid = Grid.parse(t, folder)
        simulation = Simulation.parse(t)
        sampling = Sampling.parse(t)
        resources = Placement.parse_resources(t)
        # a simulated sweep without a calibration never reads [recipe], and [data] only for its vocabulary
        uses_data = objective == "train" or bool(t.table("calibrate"))
        training = Training.parse(t, raw, uses_data, grid.template)
        placement = Placement.parse(t, resources)
        if uses_data:
            batch = grid.batch_tokens
            require(batch % grid.seq_len == 0,
                     f"batch_tokens {batch} must be a whole number of sequences of seq_len {grid.seq_len}")
            require(batch // grid.seq_len % placement.workers == 0,
                    f"batch_tokens {batch} is {batch // grid.seq_len} sequences, which "
                    f"[resources] workers = {placement.workers} cannot share equally")
            objectives.validate_recipe(training.recipe)
            require(not sampling.branches or objective != "train" or training.recipe.get("schedule") == "wsd",
                    "branches = true needs [recipe] schedule = \"wsd\": a branch warms down from a constant-rate phase")
            for branch in training.recipe.get("branch_budgets", []) if objective == "train" else []:
                require(any(math.isclose(branch, c, rel_tol=1e-9) for c in grid.budgets),
                        f"[recipe] branch_budgets {branch:.4g} is not one of budgets "
                        f"({', '.join(f'{c:.4g}' for c in grid.budgets)}): a branch's loss is a run of the cell at "
                        "its budget, so a budget of no cell would add one")
        if training.data is not None:  # its tokenizer's vocabulary is the model's, trained or simulated: one design
            objectives.validate_data(training.data)
        grid = grid.with_vocab_size(training.data)
        if "architecture" in grid.template:  # measured counts, kept with the sweep's other caches
            from loopscale.model import measured

            measured.cache_in(placement.cache_dir)
        training = dataclasses.replace(training, calibrate=Calibration.parse(t.table("calibrate"), grid))
        spec = cls(name=name, objective=objective, grid=grid, sampling=sampling, simulation=simulation,
                   training=training, placement=placement, rungs=Rungs.parse(t, grid),
                   sensitivity=Sensitivity.parse(t, objective), source=source, folder=str(folder.resolve()), text=text)
        spec.cells()  # every cell must have a width that trains
        if "testing" in raw:  # outside TOP_KEYS: refused in one line unless the test suite runs
            widths = {c.key: c.widths for c in spec.cells()}
            spec = dataclasses.replace(spec, testing=testing.parse_aids(raw["testing"], widths, spec.objective))
        uri = placement.tracking_uri
        check_store(uri, create=True)
        require(not (uri.startswith("sqlite:") and "?" in uri),
                f"tracking_uri {uri!r} carries options ({uri.partition('?')[2]}); a sweep "
                "writes its store: name the database file alone")
        for key in ("storage", "cache_dir"):
            check_folder(key, getattr(placement, key))
        return spec

    # ---- derived -------------------------------------------------------------------------------------
    def cells(self, stage: str = "search") -> list[Cell]:
        return space.cells(self.grid, self.sampling.trials_per_cell, self.training.calibrate, stage)

    def planned_trials(self) -> int:
        return sum(c.n_trials for stage in STAGES for c in self.cells(stage))

    def trial_config(self, cell: Cell, s: float, recipe: dict[str, Any] | None = None) -> objectives.TrialConfig:
        """The trial (objectives/trial.py) of width s in ``cell``, checked once, here; ``recipe`` overrides the
        spec's."""
        objective = "train" if cell.stage == "calibrate" else self.objective
        common = {"budget_flops": float(cell.budget), "r": cell.r, "s": float(s),
                  "template": self.grid.model_template(), "batch_tokens": self.grid.batch_tokens,
                  "seed": self.sampling.seed, "objective": objective}
        aids = testing.trial_aids(self.testing, cell.key) or None
        if objective == "simulate":
            sim = self.simulation
            return objectives.TrialConfig(**common, noise=sim.noise, cell_noise=sim.cell_noise, misspec=sim.misspec,
                                          law=dict(sim.law) if sim.law else None, testing=aids)
        place, training = self.placement, self.training
        return objectives.TrialConfig(**common, data=training.data,
                                      recipe=dict(recipe if recipe is not None else training.recipe),
                                      device="cuda" if place.gpus_per_trial > 0 else "cpu",
                                      num_threads=max(1, int(place.cpus_per_trial)), cache_dir=place.cache_dir,
                                      val_tokens=training.val_tokens,
                                      # a simulated spec's aids are not for its calibration's trained trials
                                      testing=aids if self.objective == "train" else None)

    def resources(self, stage: str) -> dict[str, float]:
        """Ray resources of one trial's worker; a simulated trial needs one CPU whatever the spec asks of
        training."""
        if stage != "calibrate" and self.objective == "simulate":
            return {"cpu": 1.0, "gpu": 0.0}
        return {"cpu": self.placement.cpus_per_trial, "gpu": self.placement.gpus_per_trial}

    def workers_of(self, stage: str) -> int:
        """Data-parallel workers of one trial of ``stage`` (a simulated trial is one process)."""
        return 1 if stage != "calibrate" and self.objective == "simulate" else self.placement.workers

    def concurrency(self, stage: str, cpus_available: float) -> int:
        """Trials side by side: ``max_concurrent`` if given, else as many as the CPUs hold."""
        per_trial = self.resources(stage)["cpu"] * self.workers_of(stage)
        return self.placement.max_concurrent or max(1, int(cpus_available // per_trial))

    def design(self) -> dict[str, Any]:
        """What the sweep measures, one flat record: the name, the objective and each part's hashed fields (as
        each field declares it: never a ``PLACEMENT`` one, an ``added`` one only where it differs from the value
        that behaves as before it was added, so a sweep started by an earlier version keeps its ``spec_hash``
        and resumes). A spec's own architecture enters by its source fingerprint, so a checkout in another folder
        resumes and an edited file does not."""
        values = {"name": self.name, "objective": self.objective}
        for part in (self.grid, self.sampling, self.simulation, self.training, self.placement, self.rungs,
                     self.sensitivity):
            values.update(hashed(part))
        if "architecture" in values["template"]:  # by its source, not by where the spec's folder lies
            from loopscale.model import architecture

            values["template"]["architecture"] = architecture.fingerprint(values["template"]["architecture"])
        return values

    @property
    def spec_hash(self) -> str:
        blob = json.dumps(self.design(), sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


TOP_KEYS = (
    "name", "objective", "seed", "budgets", "recurrences", "seq_len", "batch_tokens", "val_tokens",
    "trials_per_cell", "sampler", "tolerance", "branches", "information", "deferred_budgets", "rounds", "seeds",
    "min_steps", "rate_sensitivity",
    "first_guess_tokens_per_param",
    "tracking_uri", "storage",
    "cache_dir", "address", "template", "widths", "simulate", "data", "recipe", "calibrate", "resources", "validate",
)


def resolve_spec_path(spec: str | os.PathLike) -> Path:
    """A spec file path, or a preset shipped with the package (``smoke``, ``demo``, ``paper``)."""
    path = Path(spec)
    if path.is_file():
        return path
    if str(spec) in PRESET_NAMES:
        return Path(str(resources.files("loopscale.search") / "presets" / f"{spec}.toml"))
    raise ValueError(f"no spec file {str(spec)!r} (presets: {', '.join(PRESET_NAMES)})")
