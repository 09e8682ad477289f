"""What ``loopscale plan`` prints a person: its warnings before anything else, one line per cell (every width on
request), every line within 120 columns, ranges low-high, and the GPU time of a GPU sweep at a stated MFU."""

from __future__ import annotations

import re

import pytest

from loopscale.search import SweepSpec
from loopscale.search.cli import main
from loopscale.search.plan.flops import MFU, PEAK_FLOPS, flops_range
from loopscale.analysis.numbers import COLUMNS
from loopscale.search.plan.render import render_plan
from loopscale.search.plan.walltime import Throughput

STEPS = Throughput(flops_per_s=5e9, step_s=0.1, shape="s=1 r=1 width 8", device="cpu", setup_s=2.0, side_by_side=2)
RANGE = re.compile(r"(\d+(?:\.\d+)?)([kMB]?)-(\d+(?:\.\d+)?)([kMB]?)\b")
SCALE = {"": 1, "k": 1e3, "M": 1e6, "B": 1e9}


@pytest.mark.parametrize("preset, throughput", [("demo", STEPS), ("paper", None)])
def test_every_line_fits_the_terminal_and_warnings_come_first(preset, throughput):
    spec = SweepSpec.from_toml(preset)
    lines = render_plan(spec, throughput).splitlines()
    assert max(len(line) for line in lines) <= COLUMNS
    head = next(i for i, line in enumerate(lines) if line.startswith(f"sweep '{preset}'"))
    assert all(line.startswith(("warning: ", "  ")) for line in lines[:head])  # warnings (wrapped) come first
    assert not any(line.startswith("warning") for line in lines[head:])
    if preset == "paper":  # it warns of cells whose first guess is an edge of their widths
        assert lines[0].startswith("warning: cell C=1e+17,r=1: ")
    rows = [line for line in lines if line.startswith("  C=")]
    assert [row.split()[0] for row in rows] == [cell.key for cell in spec.cells()]  # one line per cell
    for row in rows:
        for low, low_unit, high, high_unit in RANGE.findall(row):  # every range reads low-high
            assert float(low) * SCALE[low_unit] <= float(high) * SCALE[high_unit], row
    assert max(len(line) for line in render_plan(spec, throughput, widths=True).splitlines()) <= COLUMNS


def test_the_paper_presets_gpu_hours_state_their_assumption():
    spec = SweepSpec.from_toml("paper")
    line = next(line for line in render_plan(spec, None).splitlines() if line.startswith("GPU time: "))
    low, high = (f / (MFU * PEAK_FLOPS) / 3600 for f in flops_range(spec))
    assert line.startswith(f"GPU time: {low:.0f}-{high:.0f} GPU-hours, assuming 40% MFU of an H100")
    assert "989 TFLOP/s" in line
    assert "GPU time" not in render_plan(SweepSpec.from_toml("demo"), STEPS)  # a CPU sweep has none


def test_the_eta_range_reads_shorter_first():
    text = render_plan(SweepSpec.from_toml("demo"), STEPS)
    eta = next(line for line in text.splitlines() if line.startswith("ETA search + analysis: "))
    figures = [int(m) for m in re.findall(r"(\d+) min", eta)]
    assert figures == sorted(figures) and figures


def test_plan_prints_every_width_on_request(capsys):
    assert main(["plan", "smoke", "--objective", "simulate"]) == 0
    short = capsys.readouterr().out
    assert main(["plan", "smoke", "--objective", "simulate", "--widths"]) == 0
    full = capsys.readouterr().out
    spec = SweepSpec.from_toml("smoke", objective="simulate")
    assert "cell C=1e+12,r=1: 4 trials over 16 widths" in full and "cell C=1e+12,r=1:" not in short
    assert len(full.splitlines()) > len(short.splitlines()) + sum(len(c.widths) for c in spec.cells()) - 10
