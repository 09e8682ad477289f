"""Spec input that got past validation: each is refused in one line, exit 2, before Ray starts and with nothing
written (``refuses`` of test_bad_input.py)."""

from __future__ import annotations

import tomllib

import pytest

from loopscale.search import SweepSpec
from loopscale.search.spec_parts import MAX_CELLS
from test_bad_input import refuses, spec_file, workdir  # noqa: F401 (workdir is a fixture)

LAW = {"E": 1.5, "A": 400.0, "alpha": 0.3, "B": 400.0, "beta": 0.3, "phi": 0.5}

MISTAKES = [
    # cell keys carry 3 significant digits: two budgets of one key would share their trials' tags
    ("budgets with one cell key", {"budgets": [1e12, 1.001e12, 1e13]},
     "budgets 1e+12 and 1.001e+12 share the cell key C=1e+12"),
    ("CPUs below Ray's granularity", {"resources": {"cpus": 0.00001}}, "[resources] cpus = 1e-05"),
    ("GPUs below Ray's granularity", {"resources": {"gpus": 0.00001}}, "[resources] gpus = 1e-05"),
    ("CPUs finer than Ray counts", {"resources": {"cpus": 0.50001}}, "[resources] cpus = 0.50001"),
    ("a negative checkpoint period", {"resources": {"checkpoint_s": -1}}, "[resources] checkpoint_s must be >= 0"),
    ("a boolean law constant", {"simulate": {"law": {**LAW, "E": True}}}, "E in [simulate] law must be a number"),
    ("a string law constant", {"simulate": {"law": {**LAW, "A": "1"}}}, "A in [simulate] law must be a number"),
    ("a negative law constant", {"simulate": {"law": {**LAW, "B": -400.0}}}, "[simulate] law needs B > 0"),
    ("a negative exponent", {"simulate": {"law": {**LAW, "alpha": -0.3}}}, "[simulate] law needs alpha > 0"),
    ("a name that reads as an option", {"name": "-rf"}, "name '-rf' must start with a letter or a digit"),
    ("more cells than a sweep should hold", {"budgets": [1e12 * (k + 1) for k in range(400)]},
     f"800 cells, more than {MAX_CELLS}"),
    ("nested too deeply", lambda root: "x = " + "[" * 5000 + "]" * 5000 + "\n", "spec.toml: not valid TOML"),
    ("storage under a device file", {"storage": "/dev/null/rt"}, "storage /dev/null/rt"),
    ("storage where no folder can be made", {"storage": "/proc/self/rt"}, "storage /proc/"),
]


@pytest.mark.parametrize("what, spec, message", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_refused_before_any_work(workdir, capsys, what, spec, message):  # noqa: F811
    path = workdir / "spec.toml"
    if callable(spec):
        path.write_text(spec(workdir))
    else:
        spec_file(workdir, **spec)
    for command in ("plan", "search"):  # plan first: on a spec it accepts, search would run the sweep
        refuses([command, str(path)], workdir, capsys, message)


@pytest.mark.parametrize("item", ['seed=1\n[extra]', 'name="a"\nseed = 5', "seed=1\r", "x=" + "[" * 5000])
def test_a_set_item_is_applied_whole_or_refused(workdir, capsys, item):  # noqa: F811
    path = spec_file(workdir)
    refuses(["plan", str(path), "--set", item], workdir, capsys, "--set")


@pytest.mark.parametrize("items", [["seed=1"], ['name="a-b"', "widths.s_max=8"], ['address="two\\nlines"']])
def test_the_logged_spec_always_parses(workdir, items):  # noqa: F811
    spec = SweepSpec.from_toml(spec_file(workdir), items)
    logged = tomllib.loads(spec.text)
    assert (logged["seed"], logged["name"], logged.get("address")) == (spec.sampling.seed, spec.name,
                                                                       spec.placement.address)
