"""Property-based tests of the sweep-spec parser (hypothesis).

Valid specs are drawn from shapes whose every recurrence divides the shared depth and whose budgets buy at
least ``min_steps`` optimizer steps of the narrowest model (sized with ``model``'s accounting, the one place
FLOPs are counted); they must parse, round-trip, and yield exactly the widths an independent pass over every
whole-head width says are feasible. One mutation of a valid spec (an unknown or misspelled key, a value of the
wrong type, an out-of-range number) must raise ValueError with one line, never another exception.
"""

from __future__ import annotations

import difflib
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, assume, event, given, settings
from hypothesis import strategies as st

from loopscale.model import LoopedConfig, count_params, flops_per_token, tokens_for_budget
from loopscale.search import SweepSpec
from loopscale.search.spec import TOP_KEYS
from loopscale.search.spec_parts import SAMPLERS, TEMPLATE_KEYS
from test_spec import to_toml

# Where the drawn specs log and store; parsing must never create it (checked after every valid spec).
ROOT = Path(tempfile.gettempdir()) / "loopscale-spec-properties-never-written"
# No "explain" phase: it slows every failure down and trips over the specs' nested lists (a hypothesis bug).
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])
MUTATIONS = settings(SETTINGS, max_examples=200)  # cheap: a mutated spec fails in its first checks
TABLE_KEYS = {
    "template": TEMPLATE_KEYS, "widths": ("s_min", "s_max", "tokens_per_param"),
    "simulate": ("noise", "cell_noise", "misspec", "law"),
    "resources": ("cpus", "gpus", "workers", "max_concurrent", "retries"),
}


# ---- valid specs ---------------------------------------------------------------------------------------
@st.composite
def valid_specs(draw) -> dict[str, Any]:
    head_dim = draw(st.sampled_from([8, 16, 32, 64]))
    width_unit = draw(st.sampled_from([8, 16, 32, 64]))
    step = head_dim / width_unit  # s moves in whole heads
    prelude, coda = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    shared = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12]))
    divisors = [r for r in range(1, shared + 1) if shared % r == 0]
    recurrences = draw(st.lists(st.sampled_from(divisors), min_size=1, max_size=4, unique=True))
    template = {"depth": prelude + shared + coda, "prelude": prelude, "coda": coda, "width_unit": width_unit,
                "head_dim": head_dim, "injection": draw(st.sampled_from(["linear", "additive", "none"]))}
    if draw(st.booleans()):
        template["vocab_size"] = draw(st.integers(2, 50_000))
    lo_heads = draw(st.integers(1, 4))
    hi_heads = lo_heads + draw(st.integers(0, 12))
    seq_len = draw(st.integers(8, 256))
    batch_tokens = seq_len * draw(st.integers(1, 16))
    min_steps = draw(st.integers(1, 20))
    cheapest = {r: LoopedConfig.iso_depth(lo_heads * step, r, **{"vocab_size": 32064, **template}, seq_len=seq_len)
                for r in recurrences}
    floor = max(flops_per_token(c) * batch_tokens * min_steps for c in cheapest.values())
    factors = draw(st.lists(st.floats(0.0, 3.0), min_size=1, max_size=3, unique=True))
    spec: dict[str, Any] = {
        "name": draw(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,15}", fullmatch=True)),
        "objective": "simulate", "seed": draw(st.integers(0, 2**31)),
        "budgets": sorted({f"{floor * 10**f:.3g}": float(floor * 10**f) for f in factors}.values()),  # one per key
        "recurrences": recurrences,
        "seq_len": seq_len, "batch_tokens": batch_tokens, "val_tokens": draw(st.integers(1, 10**6)),
        "trials_per_cell": draw(st.integers(1, 8)), "sampler": draw(st.sampled_from(SAMPLERS)),
        "min_steps": min_steps, "first_guess_tokens_per_param": draw(st.floats(0.5, 200.0)),
        "tracking_uri": f"sqlite:///{ROOT / 'mlflow.db'}", "storage": str(ROOT / "tune"),
        "cache_dir": str(ROOT / "cache"), "template": template,
        "widths": {"s_min": _number(lo_heads * step), "s_max": _number(hi_heads * step)},
        "simulate": {"noise": draw(st.floats(0.0, 0.1))},
        "resources": {"cpus": draw(st.integers(1, 4)), "retries": draw(st.integers(0, 3))},
    }
    if draw(st.booleans()):
        low = draw(st.floats(0.01, 100.0))
        spec["widths"]["tokens_per_param"] = [low, low * draw(st.floats(1.5, 1e4))]
    return spec


def _number(x: float) -> int | float:
    return int(x) if x == int(x) else x


def expected_widths(raw: dict[str, Any], budget: float, r: int) -> list[float]:
    """Every whole-head s in [s_min, s_max] that buys min_steps steps (and lies in the D/N window), found by
    sizing EACH width with the accounting: no assumption that wider models cost more."""
    t, w = raw["template"], raw["widths"]
    step = t["head_dim"] / t["width_unit"]
    feasible = []
    for heads in range(round(w["s_min"] / step), round(w["s_max"] / step) + 1):
        config = LoopedConfig.iso_depth(heads * step, r, **{"vocab_size": 32064, **t}, seq_len=raw["seq_len"])
        tokens = tokens_for_budget(config, budget, raw["batch_tokens"])
        window = w.get("tokens_per_param")
        if tokens // raw["batch_tokens"] >= raw["min_steps"] and (
                window is None or window[0] <= tokens / count_params(config).N <= window[1]):
            feasible.append(heads * step)
    return feasible


def spec_to_raw(spec: SweepSpec) -> dict[str, Any]:
    """The parsed spec written back as a spec dict (the round trip's other half)."""
    widths = {"s_min": spec.grid.s_min, "s_max": spec.grid.s_max,
              **({"tokens_per_param": list(spec.grid.tokens_per_param)} if spec.grid.tokens_per_param else {})}
    resources = {"cpus": spec.placement.cpus_per_trial, "gpus": spec.placement.gpus_per_trial,
                 "retries": spec.placement.retries,
                 "workers": spec.placement.workers,
                 **({"max_concurrent": spec.placement.max_concurrent} if spec.placement.max_concurrent else {})}
    return {
        "name": spec.name, "objective": spec.objective, "seed": spec.sampling.seed, "budgets": list(spec.grid.budgets),
        "recurrences": list(spec.grid.recurrences), "seq_len": spec.grid.seq_len,
        "batch_tokens": spec.grid.batch_tokens,
        "val_tokens": spec.training.val_tokens, "trials_per_cell": spec.sampling.trials_per_cell,
        "sampler": spec.sampling.sampler,
        "min_steps": spec.grid.min_steps, "first_guess_tokens_per_param": spec.grid.first_guess_tokens_per_param,
        "tracking_uri": spec.placement.tracking_uri, "storage": spec.placement.storage,
        "cache_dir": spec.placement.cache_dir,
        "template": dict(spec.grid.template), "widths": widths,
        "simulate": {"noise": spec.simulation.noise,
                     **({"law": dict(spec.simulation.law)} if spec.simulation.law else {})},
        "resources": resources,
    }


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("specs")


@SETTINGS
@given(raw=valid_specs())
def test_valid_specs_parse_round_trip_and_keep_exactly_the_feasible_widths(raw, files):
    expected = {(b, r): expected_widths(raw, b, r) for b in raw["budgets"] for r in raw["recurrences"]}
    event("some cell has no width in the D/N window" if not all(expected.values()) else "valid")
    if not all(expected.values()):  # the D/N window leaves some cell without a width: one clear error
        with pytest.raises(ValueError, match="tokens_per_param") as info:
            SweepSpec.from_dict(raw)
        assert "\n" not in str(info.value)
        return
    spec = SweepSpec.from_dict(raw)
    cells = spec.cells()
    assert [(c.budget, c.r) for c in cells] == [(b, r) for b in raw["budgets"] for r in raw["recurrences"]]
    for cell in cells:
        assert list(cell.widths) == expected[(cell.budget, cell.r)]
        assert cell.first_guess in cell.widths and cell.n_trials == min(raw["trials_per_cell"], len(cell.widths))
        for s in cell.widths:
            config = spec.grid.model(s, cell.r)
            tokens = tokens_for_budget(config, cell.budget, spec.grid.batch_tokens)
            assert config.width % spec.grid.head_dim == 0 and config.width == round(spec.grid.width_unit * s)
            assert tokens % spec.grid.batch_tokens == 0 and tokens // spec.grid.batch_tokens >= spec.grid.min_steps
            assert 0 < tokens * flops_per_token(config) <= cell.budget  # the budget is never overspent
    assert spec.planned_trials() == sum(c.n_trials for c in cells)

    again = SweepSpec.from_dict(spec_to_raw(spec))
    assert again == spec and again.spec_hash == spec.spec_hash and again.cells() == cells
    path = files / "spec.toml"
    path.write_text(to_toml(raw))
    from_file = SweepSpec.from_toml(path)
    assert from_file == spec and from_file.text == to_toml(raw)
    assert not ROOT.exists()  # reading a spec writes nothing


# ---- mutations ------------------------------------------------------------------------------------------
def must_refuse(raw: dict[str, Any], match: str | None = None) -> str:
    """Parsing must fail with a ValueError of one line (any other exception type fails the test)."""
    try:
        SweepSpec.from_dict(raw)
    except ValueError as exc:
        message = str(exc)
    else:
        pytest.fail(f"accepted a bad spec: {raw}")
    assert message and "\n" not in message, message
    if match is not None:
        assert match in message, message
    return message


def tables(raw: dict[str, Any]) -> dict[str, tuple[dict[str, Any], tuple[str, ...]]]:
    found = {"top level": (raw, TOP_KEYS)}
    found.update({f"[{name}]": (raw[name], keys) for name, keys in TABLE_KEYS.items() if name in raw})
    return found


@MUTATIONS
@given(valid_specs(), st.data())
def test_an_unknown_key_is_refused(raw, data):
    where = data.draw(st.sampled_from(sorted(tables(raw))))
    table, known = tables(raw)[where]
    key = data.draw(st.from_regex(r"[a-z][a-z_]{0,14}", fullmatch=True).filter(lambda k: k not in known))
    table[key] = data.draw(st.integers() | st.text(max_size=5) | st.floats(allow_nan=False))
    assert f"unknown key {key!r} in {where}" in must_refuse(raw)


def typos(word: str) -> st.SearchStrategy[str]:
    """One deleted, doubled, swapped or replaced character."""
    i = st.integers(0, len(word) - 1)
    return st.one_of(
        i.map(lambda k: word[:k] + word[k + 1:]),
        i.map(lambda k: word[:k] + word[k] + word[k:]),
        st.integers(0, max(0, len(word) - 2)).map(lambda k: word[:k] + word[k + 1:k + 2] + word[k] + word[k + 2:]),
        st.tuples(i, st.sampled_from("abcdefghijklmnopqrstuvwxyz_"))
        .map(lambda a: word[:a[0]] + a[1] + word[a[0] + 1:]),
    )


@MUTATIONS
@given(valid_specs(), st.data())
def test_a_misspelled_key_is_refused_with_a_suggestion(raw, data):
    where = data.draw(st.sampled_from(sorted(tables(raw))))
    table, known = tables(raw)[where]
    key = data.draw(st.sampled_from(sorted(k for k in table if len(k) >= 4)))
    typo = data.draw(typos(key))
    assume(typo not in known)
    table[typo] = table.pop(key)
    message = must_refuse(raw, f"unknown key {typo!r} in {where} (did you mean ")
    suggested = message.split("(did you mean '")[1].split("'")[0]
    # the misspelled key itself, or a known key at least as close to the typo (``cpus`` -> ``apus`` -> ``gpus``)
    assert suggested in known and similarity(typo, suggested) >= similarity(typo, key)


def similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


# The expected kind of every scalar and list key; a value of any other kind must be refused.
KINDS: dict[tuple[str, ...], str] = {
    **{(k,): "int" for k in ("seed", "seq_len", "batch_tokens", "val_tokens", "trials_per_cell", "min_steps")},
    **{(k,): "str" for k in ("name", "objective", "sampler", "tracking_uri", "storage", "cache_dir", "address")},
    ("first_guess_tokens_per_param",): "number", ("budgets",): "numbers", ("recurrences",): "ints",
    **{("template", k): "int" for k in ("depth", "prelude", "coda", "width_unit", "head_dim", "vocab_size",
                                        "bptt_k")},
    ("template", "injection"): "str",
    ("widths", "s_min"): "number", ("widths", "s_max"): "number", ("widths", "tokens_per_param"): "numbers",
    ("simulate", "noise"): "number", ("simulate", "law"): "table",
    ("resources", "cpus"): "number", ("resources", "gpus"): "number",
    ("resources", "max_concurrent"): "int", ("resources", "retries"): "int", ("resources", "workers"): "int",
    **{(k,): "table" for k in ("template", "widths", "simulate", "data", "recipe", "calibrate", "resources")},
}
WRONG: dict[str, st.SearchStrategy] = {
    "int": st.floats(allow_nan=False).filter(lambda x: x != int(x) if math.isfinite(x) else True)
    | st.booleans() | st.text(max_size=4) | st.lists(st.integers(), max_size=2),
    "number": st.booleans() | st.text(max_size=4) | st.lists(st.floats(), max_size=2)
    | st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
    "str": st.integers() | st.floats() | st.booleans() | st.lists(st.text(max_size=2), max_size=2),
    "numbers": st.text(max_size=4) | st.integers() | st.lists(st.text(max_size=2) | st.booleans(), min_size=1,
                                                             max_size=2),
    "ints": st.text(max_size=4) | st.integers() | st.lists(st.floats().filter(lambda x: x != int(x) if
                                                                               math.isfinite(x) else True)
                                                           | st.booleans() | st.text(max_size=2),
                                                           min_size=1, max_size=2),
    "table": st.integers() | st.text(max_size=4) | st.lists(st.integers(), max_size=2),
}


def put(raw: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    target = raw
    for part in path[:-1]:
        target = target.setdefault(part, {})
    target[path[-1]] = value


@MUTATIONS
@given(valid_specs(), st.sampled_from(sorted(KINDS)), st.data())
def test_a_value_of_the_wrong_type_is_refused(raw, path, data):
    put(raw, path, data.draw(WRONG[KINDS[path]]))
    must_refuse(raw)


# Values out of range for each key (relative to the drawn spec where they must be).
OUT_OF_RANGE: dict[tuple[str, ...], Any] = {
    ("budgets",): lambda raw: st.lists(st.floats(max_value=0) | st.just(math.inf) | st.just(math.nan), min_size=1,
                                       max_size=2).map(lambda bad: [*raw["budgets"], *bad]),
    ("recurrences",): lambda raw: st.integers(max_value=0).map(lambda r: [*raw["recurrences"], r]),
    **{(k,): lambda raw: st.integers(max_value=0)
       for k in ("seq_len", "batch_tokens", "val_tokens", "trials_per_cell", "min_steps")},
    ("first_guess_tokens_per_param",): lambda raw: st.floats(max_value=0) | st.just(math.inf),
    ("widths", "s_min"): lambda raw: st.floats(max_value=0) | st.just(math.nan),
    ("widths", "tokens_per_param"): lambda raw: st.tuples(st.floats(0, 1e6), st.floats(0, 1e6))
    .filter(lambda w: not 0 < w[0] < w[1]).map(list),
    ("simulate", "noise"): lambda raw: st.floats(max_value=0, exclude_max=True) | st.just(math.inf),
    ("resources", "cpus"): lambda raw: st.floats(max_value=0) | st.just(math.inf),
    ("resources", "gpus"): lambda raw: st.floats(max_value=0, exclude_max=True) | st.just(math.nan),
    ("resources", "retries"): lambda raw: st.integers(max_value=-1),
    ("resources", "max_concurrent"): lambda raw: st.integers(max_value=0),
    ("resources", "workers"): lambda raw: st.integers(max_value=0),
    ("template", "head_dim"): lambda raw: st.integers(max_value=0) | st.sampled_from([3, 5, 7]),
    ("template", "width_unit"): lambda raw: st.integers(max_value=0),
    ("template", "depth"): lambda raw: st.integers(max_value=raw["template"]["prelude"] + raw["template"]["coda"]),
    ("template", "prelude"): lambda raw: st.integers(max_value=-1),
    ("template", "coda"): lambda raw: st.integers(max_value=-1),
    ("template", "vocab_size"): lambda raw: st.integers(max_value=1),
    ("template", "bptt_k"): lambda raw: st.integers(max_value=0),
    ("seed",): lambda raw: st.integers(max_value=-1) | st.integers(min_value=2**63),
    ("widths", "s_max"): lambda raw: st.floats(max_value=raw["widths"]["s_min"], exclude_max=True)
    | st.just(math.inf) | st.integers(10**4, 10**30),
    ("template", "injection"): lambda raw: st.text(max_size=8).filter(lambda v: v not in ("linear", "additive",
                                                                                         "none")),
    ("objective",): lambda raw: st.text(max_size=8).filter(lambda v: v not in ("train", "simulate")),
    ("sampler",): lambda raw: st.text(max_size=8).filter(lambda v: v not in SAMPLERS),
    ("name",): lambda raw: st.text(max_size=8).filter(
        lambda v: not v.replace("-", "").replace("_", "").replace(".", "").isalnum()),
}


@MUTATIONS
@given(valid_specs(), st.sampled_from(sorted(OUT_OF_RANGE)), st.data())
def test_an_out_of_range_number_is_refused(raw, path, data):
    put(raw, path, data.draw(OUT_OF_RANGE[path](raw)))
    must_refuse(raw)


@SETTINGS
@given(raw=valid_specs(), garbage=st.binary(min_size=1, max_size=40), data=st.data())
def test_corrupted_spec_files_are_one_line_errors(raw, garbage, data, files):
    """A spec file with random bytes spliced in either still parses or fails with one ValueError line."""
    text = to_toml(raw).encode()
    at = data.draw(st.integers(0, len(text)))
    path = files / "corrupt.toml"
    path.write_bytes(text[:at] + garbage + text[at:])
    try:
        SweepSpec.from_toml(path)
    except ValueError as exc:
        assert str(exc) and "\n" not in str(exc)
