"""The sweep spec: one TOML file that says what to search, how, and where to log it.

``SweepSpec.from_toml(path)`` reads and validates it; every mistake is ONE ``ValueError`` line, raised before
anything is written or Ray starts. The cells it describes and the config of each trial are search/space.py's;
the typed TOML access is search/toml_table.py's; the store check is analysis/store.py's.

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
    min_steps = 10                   # a width needs at least this many optimizer steps in its cell
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
    [resources]   # cpus, gpus per trial (per worker); workers per trial (data-parallel); max_concurrent; retries;
                  # checkpoint_s: seconds of training between a trial's checkpoints (default 1800; 0 = none),
                  # from which a killed trial resumes exactly (objectives/checkpoint.py)
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
from loopscale.analysis.store import DEFAULT_RUN_DIR, check_store, resolve_tracking_uri
from loopscale.model import BUILTIN, INJECTIONS, ISO_DEPTH, LoopedConfig, iso_depth_template
from loopscale.objectives.noise import Noise
from loopscale.objectives import testing
from loopscale.objectives.trial import OBJECTIVES

from . import space
from .overrides import apply_sets, effective_text
from .preflight import check_folder
from .space import STAGES, Calibration, Cell
from .toml_table import Table, require

SAMPLERS = ("law", "gp", "tpe", "grid", "random")
PRESET_NAMES = ("smoke", "demo", "paper")
TEMPLATE_KEYS = ("depth", "prelude", "coda", "width_unit", "head_dim", "injection", "bptt_k", "lanes", "vocab_size",
                 "architecture", "options")
DEFAULT_TOLERANCE = 0.1  # log width: the law sampler's default precision of a cell's optimum
MAX_WIDTHS = 1000  # whole-head widths in [s_min, s_max]: each is sized per cell while parsing
MAX_SEED = 2**63 - 1  # torch.manual_seed's limit
MAX_NAME = 128
MAX_CELLS = 256  # budgets x recurrences, ten times the paper's 6 x 4: each cell is sized width by width
RAY_RESOURCE_UNIT = 0.0001  # Ray's resource granularity (ray._raylet.RESOURCE_UNIT_SCALING = 10,000)
LAW_CONSTANTS = ("E", "A", "alpha", "B", "beta", "phi")
DEFAULT_CHECKPOINT_S = 1800  # a trial's checkpoint every 30 minutes of training: a kill loses at most that
PLACEMENT = {"placement": True}  # where a sweep runs and logs: may move between resumes, so never hashed


def added(default: Any) -> Any:
    """A field added after sweeps were started: left out of ``spec_hash`` while it holds ``default``, the value
    that behaves as those sweeps did, so an upgrade does not turn a resumable sweep into a "different spec"."""
    return field(default=default, metadata={"hashed_unless": default})


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
    # data-parallel workers of one training trial, each with cpus_per_trial and gpus_per_trial
    workers: int = field(metadata=PLACEMENT)
    max_concurrent: int | None = field(metadata=PLACEMENT)
    retries: int = field(metadata=PLACEMENT)
    checkpoint_s: float = field(metadata=PLACEMENT)  # seconds of training between a trial's checkpoints; 0 = none
    tracking_uri: str = field(metadata=PLACEMENT)
    storage: str = field(metadata=PLACEMENT)
    cache_dir: str = field(metadata=PLACEMENT)
    address: str | None = field(metadata=PLACEMENT)
    source: str = field(default="", compare=False)  # where it was read from, for messages
    text: str = field(default="", compare=False, repr=False)  # the TOML as written, for the artifact
    cell_noise: float = Noise().cell_noise
    misspec: float = Noise().misspec
    tolerance: float = DEFAULT_TOLERANCE
    branches: bool = False
    information: float = added(0.0)
    deferred_budgets: int = added(1)
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
    def from_dict(cls, raw: dict[str, Any], *, source: str = "<dict>", text: str = "") -> "SweepSpec":
        """Validate a parsed spec; relative paths are resolved against the current directory."""
        t = Table({k: v for k, v in raw.items() if k != "testing"}, "top level", TOP_KEYS)
        name = t.str("name", required=True)
        require(name.replace("-", "").replace("_", "").replace(".", "").isalnum(),
                 f"name {name!r} may use only letters, digits, '-', '_' and '.'")
        # the printed `loopscale analyze --experiment NAME` must parse: a leading '-' reads as an option
        require(name[0].isalnum(), f"name {name!r} must start with a letter or a digit")
        # it names folders (with Tune's suffixes) and files, whose names a file system caps at 255 bytes
        require(len(name.encode()) <= MAX_NAME, f"name is {len(name.encode())} bytes long; keep it to {MAX_NAME}")
        objective = t.choice("objective", OBJECTIVES, "train")
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
            other = keys.setdefault(space.cell_key(b, 1), b)
            require(other == b, f"budgets {other:.4g} and {b:.4g} share the cell key {space.cell_key(b, 1)[:-4]} "
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
        template.update(_architecture(template_table, Path(source).parent if Path(source).is_file() else Path.cwd()))
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

        sim = Table(t.table("simulate"), "[simulate]", ("noise", "cell_noise", "misspec", "law"))
        sizes = {k: sim.number(k, default=getattr(Noise(), k)) for k in ("noise", "cell_noise", "misspec")}
        for k, v in sizes.items():
            require(v >= 0, f"[simulate] {k} must be >= 0 nats, got {v}")
        tolerance = t.number("tolerance", default=DEFAULT_TOLERANCE)
        require(tolerance > 0, f"tolerance must be > 0 (log width), got {tolerance}")
        information = t.number("information", default=0.0)
        require(information >= 0, f"information must be >= 0 (0 = off), got {information}")
        deferred = t.int("deferred_budgets", default=1)
        require(deferred >= 0, f"deferred_budgets must be >= 0 (0 = every cell takes its first trial), got {deferred}")
        law = _law(sim.table("law")) or None

        data = t.table("data") if "data" in raw else None
        recipe = t.table("recipe") if "recipe" in raw else None
        res = Table(t.table("resources"), "[resources]", ("cpus", "gpus", "workers", "max_concurrent", "retries",
                                                          "checkpoint_s"))
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

        spec = cls(
            name=name, objective=objective, budgets=budgets, recurrences=recurrences, template=template,
            s_min=float(s_min), s_max=float(s_max), tokens_per_param=tpp,
            seq_len=t.int("seq_len", default=2048), batch_tokens=t.int("batch_tokens", default=262_144),
            val_tokens=t.int("val_tokens", default=1_048_576), trials_per_cell=t.int("trials_per_cell", default=5),
            sampler=t.choice("sampler", SAMPLERS, "gp"), seed=t.int("seed", default=0),
            min_steps=t.int("min_steps", default=10),
            first_guess_tokens_per_param=float(t.number("first_guess_tokens_per_param", default=20)),
            noise=float(sizes["noise"]), cell_noise=float(sizes["cell_noise"]), misspec=float(sizes["misspec"]),
            tolerance=float(tolerance), branches=t.bool("branches", default=False),
            information=float(information), deferred_budgets=deferred, law=law, data=data, recipe=recipe,
            calibrate=None,
            cpus_per_trial=float(cpus), gpus_per_trial=float(gpus), workers=workers,
            max_concurrent=max_concurrent,
            retries=retries, checkpoint_s=float(checkpoint_s),
            tracking_uri=resolve_tracking_uri(t.str("tracking_uri")),  # the flag, if any, is already in raw
            storage=_absolute(t.str("storage") or str(Path(DEFAULT_RUN_DIR) / "tune")),
            cache_dir=_absolute(t.str("cache_dir") or str(Path(DEFAULT_RUN_DIR) / "cache")),
            address=t.str("address") or None, source=source, text=text,
        )
        for key in ("seq_len", "batch_tokens", "val_tokens", "trials_per_cell", "min_steps"):
            require(getattr(spec, key) >= 1, f"{key} must be >= 1, got {getattr(spec, key)}")
        require(0 <= spec.seed <= MAX_SEED, f"seed must be in [0, 2**63 - 1], got {spec.seed}")
        require(spec.first_guess_tokens_per_param > 0, "first_guess_tokens_per_param must be positive")
        require(not spec.information or spec.sampler == "law",
                f"information = {spec.information:g} needs sampler = \"law\" (its fitted law values a width), got "
                f"{spec.sampler!r}")
        require(not spec.branches or spec.sampler == "law",
                f"branches = true needs sampler = \"law\" (it chooses where a trial branches), got {spec.sampler!r}")
        require(spec.deferred_budgets == 1 or spec.branches,
                f"deferred_budgets = {spec.deferred_budgets} needs branches = true (a deferred cell waits for the "
                f"larger cells' branch points)")
        uses_data = objective == "train" or bool(t.table("calibrate"))  # else [data] and [recipe] are never read
        if uses_data:  # absent tables mean objectives' defaults (KJV bytes)
            data, recipe = data or {}, recipe or {}
            if data.get("tokenizer") == "bpe" and "tokenizer_vocab" not in data:  # the template's vocabulary
                data = {**data, "tokenizer_vocab": int(iso_depth_template(template)["vocab_size"])}
            spec = dataclasses.replace(spec, data=data, recipe=recipe)
            require(spec.batch_tokens % spec.seq_len == 0,
                     f"batch_tokens {spec.batch_tokens} must be a whole number of sequences of seq_len {spec.seq_len}")
            require(spec.batch_tokens // spec.seq_len % spec.workers == 0,
                    f"batch_tokens {spec.batch_tokens} is {spec.batch_tokens // spec.seq_len} sequences, which "
                    f"[resources] workers = {spec.workers} cannot share equally")
            objectives.validate_data(data)
            objectives.validate_recipe(recipe)
            require(not spec.branches or objective != "train" or recipe.get("schedule") == "wsd",
                    "branches = true needs [recipe] schedule = \"wsd\": a branch warms down from a constant-rate phase")
        spec = dataclasses.replace(spec, template={**template, "vocab_size": spec._vocab_size(uses_data)})
        spec._check_shapes()
        if "architecture" in template:  # measured counts, kept with the sweep's other caches
            from loopscale.model import measured

            measured.cache_in(spec.cache_dir)
        spec = dataclasses.replace(spec, calibrate=space.parse_calibration(t.table("calibrate"), spec))
        spec.cells()  # every cell must have a width that trains
        if "testing" in raw:  # outside TOP_KEYS: refused in one line unless the test suite runs
            widths = {c.key: c.widths for c in spec.cells()}
            spec = dataclasses.replace(spec, testing=testing.parse_aids(raw["testing"], widths, spec.objective))
        check_store(spec.tracking_uri, create=True)
        require(not (spec.tracking_uri.startswith("sqlite:") and "?" in spec.tracking_uri),
                f"tracking_uri {spec.tracking_uri!r} carries options ({spec.tracking_uri.partition('?')[2]}); a sweep "
                "writes its store: name the database file alone")
        for key in ("storage", "cache_dir"):
            check_folder(key, getattr(spec, key))
        return spec

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

    def model_template(self) -> dict[str, Any]:
        """Keyword arguments of ``LoopedConfig.iso_depth`` other than s and r (the trial config's template)."""
        return {**self.template, "seq_len": self.seq_len}

    def model(self, s: float, r: int) -> LoopedConfig:
        return LoopedConfig.iso_depth(s, r, **self.model_template())

    def s_values(self) -> tuple[float, ...]:
        return space.s_values(self)

    def cells(self, stage: str = "search") -> list[Cell]:
        return space.cells(self, stage)

    def planned_trials(self) -> int:
        return sum(c.n_trials for stage in STAGES for c in self.cells(stage))

    def trial_config(self, cell: Cell, s: float, recipe: dict[str, Any] | None = None) -> objectives.TrialConfig:
        return space.trial_config(self, cell, s, recipe)

    def resources(self, stage: str) -> dict[str, float]:
        """Ray resources of one trial's worker; a simulated trial needs one CPU whatever the spec asks of
        training."""
        if stage == "search" and self.objective == "simulate":
            return {"cpu": 1.0, "gpu": 0.0}
        return {"cpu": self.cpus_per_trial, "gpu": self.gpus_per_trial}

    def workers_of(self, stage: str) -> int:
        """Data-parallel workers of one trial of ``stage`` (a simulated trial is one process)."""
        return 1 if stage == "search" and self.objective == "simulate" else self.workers

    def concurrency(self, stage: str, cpus_available: float) -> int:
        """Trials side by side: ``max_concurrent`` if given, else as many as the CPUs hold."""
        per_trial = self.resources(stage)["cpu"] * self.workers_of(stage)
        return self.max_concurrent or max(1, int(cpus_available // per_trial))

    def design(self) -> dict[str, Any]:
        """What the sweep measures, as each field declares it: every compared field but the ``PLACEMENT`` ones,
        and an ``added`` field only where it differs from the value that behaves as before it was added (a
        sweep started by an earlier version keeps its ``spec_hash`` and resumes). A spec's own architecture
        enters by its source fingerprint, so a checkout in another folder resumes and an edited file does not."""
        values = dataclasses.asdict(self)
        if "architecture" in values["template"]:  # by its source, not by where the spec's folder lies
            from loopscale.model import architecture

            values["template"]["architecture"] = architecture.fingerprint(values["template"]["architecture"])
        return {f.name: values[f.name] for f in dataclasses.fields(self)
                if f.compare and not f.metadata.get("placement")
                and not ("hashed_unless" in f.metadata and values[f.name] == f.metadata["hashed_unless"])}

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
        return ISO_DEPTH["vocab_size"]

    def _check_shapes(self) -> None:
        for label, s in (("s_min", self.s_min), ("s_max", self.s_max)):
            width = self.width_unit * s
            require(abs(width - round(width)) < 1e-9 and round(width) % self.head_dim == 0,
                     f"[widths] {label} = {s:g} gives width {width:g}, not a multiple of head_dim {self.head_dim}; "
                     f"use s in steps of {self.s_step:g}")
        count = space.heads(self.s_max, self) - space.heads(self.s_min, self) + 1
        require(count <= MAX_WIDTHS, f"[widths] s_min..s_max spans {count} widths (s in steps of {self.s_step:g}), "
                                      f"more than {MAX_WIDTHS}; narrow it")
        for r in self.recurrences:
            self.model(self.s_min, r)  # raises the template's own one-line errors (r must divide the shared depth)


TOP_KEYS = (
    "name", "objective", "seed", "budgets", "recurrences", "seq_len", "batch_tokens", "val_tokens",
    "trials_per_cell", "sampler", "tolerance", "branches", "information", "deferred_budgets", "min_steps",
    "first_guess_tokens_per_param",
    "tracking_uri", "storage",
    "cache_dir", "address", "template", "widths", "simulate", "data", "recipe", "calibrate", "resources",
)


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


def resolve_spec_path(spec: str | os.PathLike) -> Path:
    """A spec file path, or a preset shipped with the package (``smoke``, ``demo``, ``paper``)."""
    path = Path(spec)
    if path.is_file():
        return path
    if str(spec) in PRESET_NAMES:
        return Path(str(resources.files("loopscale.search") / "presets" / f"{spec}.toml"))
    raise ValueError(f"no spec file {str(spec)!r} (presets: {', '.join(PRESET_NAMES)})")
