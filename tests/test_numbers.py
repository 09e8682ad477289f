"""The one formatter of human-facing numbers (analysis/numbers.py): each rule on the values that break naive
formatting (rounding across a suffix, trailing zeros, ranges given high first, missing values)."""

from __future__ import annotations

import math

from loopscale.analysis import numbers


def test_counts_keep_three_significant_figures_across_suffixes():
    assert [numbers.count(v) for v in (7, 512, 999.6, 13_000, 51_552, 4_758_528, 999_700, 8.21e9, 1.5e12)] == \
        ["7", "512", "1.00k", "13.0k", "51.6k", "4.76M", "1.00M", "8.21B", "1.50T"]
    assert numbers.count(3.2e16) == "3.20e16"  # past T: e-notation, never "32000T"


def test_flops_are_e_notation_without_plus_or_padding():
    assert [numbers.flops(v) for v in (2.15e19, 1e18, 3.2e-5, 6e11)] == ["2.15e19", "1.00e18", "3.20e-5", "6.00e11"]


def test_significant_figures_keep_trailing_zeros():
    assert [numbers.sig(v) for v in (0.5, 12, 0.0123456, 1234.5, 4.2e-7, 0)] == \
        ["0.500", "12.0", "0.0123", "1.23e3", "4.20e-7", "0"]
    assert numbers.sig(9.996) == "10.0"  # rounding carries into the next decade


def test_losses_and_durations():
    assert numbers.loss(2.02874) == "2.029"
    assert [numbers.duration(s) for s in (4.25, 45, 200, 1434, 3 * 3600 + 600, 5 * 86400)] == \
        ["4.2 s", "45 s", "3 min 20 s", "23 min 54 s", "3.2 h", "5.0 days"]


def test_a_range_reads_low_to_high_in_one_format():
    assert numbers.span(38.2, 36.9) == "36.9-38.2"
    assert numbers.span(4.1e8, 1.2e9, numbers.count) == "410M-1.20B"
    assert numbers.span(2.0291, 2.0289, numbers.loss) == "2.029"  # both ends read the same: one value


def test_missing_values_are_empty():
    for form in (numbers.sig, numbers.count, numbers.flops, numbers.loss, numbers.duration):
        assert form(None) == "" and form(math.nan) == ""
    assert numbers.span(1.0, math.nan) == ""


def test_wrap_keeps_every_line_within_the_columns_and_indents_continuations():
    long = "  backtest: " + " ".join(f"word{i}" for i in range(60))
    wrapped = numbers.wrap(f"short\n{long}")
    lines = wrapped.splitlines()
    assert lines[0] == "short" and len(lines) > 2
    assert max(len(line) for line in lines) <= numbers.COLUMNS
    assert all(line.startswith("    word") for line in lines[2:])  # two spaces past the line's own indent
    assert " ".join(wrapped.split()) == " ".join(f"short\n{long}".split())  # nothing lost or added
