"""The distribution installs under one namespace: a researcher's own `model.py` or `analysis/` cannot shadow it;
and a process loads only what it uses (names resolve on first use, model/lazy.py)."""

import subprocess
import sys


def python(*lines: str, cwd=None) -> str:
    """Run ``lines`` in a fresh interpreter; its standard output (a failure shows its standard error)."""
    done = subprocess.run([sys.executable, "-c", "\n".join(lines)], cwd=cwd, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_stray_model_py_in_the_working_directory_does_not_shadow_loopscale(tmp_path):
    (tmp_path / "model.py").write_text("raise SystemExit('the stray model.py was imported')\n")
    (tmp_path / "analysis").mkdir()
    (tmp_path / "analysis" / "__init__.py").write_text("raise SystemExit('the stray analysis/ was imported')\n")
    out = python("from loopscale.analysis.runs import load_runs",
                 "from loopscale import LoopedConfig, count_params, fit_joint_law",
                 "print(count_params(LoopedConfig.iso_depth(10, 4)).N)", cwd=tmp_path)
    assert out == "40152960"  # the paper (docs/paper.md): N = 40.2M at s = 10, r = 4


def test_import_loopscale_is_light_until_a_name_is_used():
    out = python("import sys, loopscale",
                 "assert 'torch' not in sys.modules, 'import loopscale pulled torch'",
                 "loopscale.LoopedConfig, loopscale.count_params",
                 "assert 'torch' not in sys.modules, 'the accounting pulled torch'",
                 "loopscale.LoopedLM",
                 "assert 'torch' in sys.modules",
                 "print(sorted(loopscale.__all__)[:2])")
    assert "LawFit" in out


def test_the_parser_leaves_the_fit_and_the_plots_unloaded():
    # every subcommand's parser (`loopscale --help`) registers the analysis commands without scipy or matplotlib
    out = python("import sys",
                 "from loopscale.search.cli import build_parser",
                 "build_parser().format_help()",
                 "print([m for m in ('scipy', 'matplotlib') if m in sys.modules])")
    assert out == "[]"


def test_the_analysis_loads_no_torch():
    # the analysis reads a runs table: fitting the law and sizing models need the accounting, not torch
    out = python("import sys",
                 "from loopscale.analysis import allocation_table, fit_joint_law",
                 "from loopscale.analysis.cli import run_export",
                 "print('torch' in sys.modules)")
    assert out == "False"


def test_every_exported_name_stays_itself_once_every_submodule_is_imported():
    # a submodule named like an exported function is bound over it on import (``fit_suite`` once was), so which
    # object a name gives depended on what an earlier test happened to import
    out = python("import importlib, pkgutil, types, loopscale",
                 "bad = []",
                 "for package in ('model', 'objectives', 'analysis', 'search'):",
                 "    pkg = importlib.import_module('loopscale.' + package)",
                 "    for info in pkgutil.iter_modules(pkg.__path__):",
                 "        importlib.import_module(f'loopscale.{package}.{info.name}')",
                 "    names = getattr(pkg, '__all__', [])",
                 "    bad += [f'{package}.{n}' for n in names if isinstance(getattr(pkg, n), types.ModuleType)]",
                 "bad += [n for n in loopscale.__all__ if isinstance(getattr(loopscale, n), types.ModuleType)]",
                 "print(bad)")
    assert out == "[]"
