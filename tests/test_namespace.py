"""The distribution installs under one namespace: a researcher's own `model.py` or `analysis/` cannot shadow it."""

import subprocess
import sys


def test_a_stray_model_py_in_the_working_directory_does_not_shadow_loopscale(tmp_path):
    (tmp_path / "model.py").write_text("raise SystemExit('the stray model.py was imported')\n")
    (tmp_path / "analysis").mkdir()
    (tmp_path / "analysis" / "__init__.py").write_text("raise SystemExit('the stray analysis/ was imported')\n")
    code = ("from loopscale.analysis.runs import load_runs\n"
            "from loopscale import LoopedConfig, count_params, fit_joint_law\n"
            "print(count_params(LoopedConfig.iso_depth(10, 4)).N)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "40152960"  # PAPER.md: N = 40.2M at s = 10, r = 4


def test_import_loopscale_is_light_until_a_name_is_used():
    code = ("import sys, loopscale\n"
            "assert 'torch' not in sys.modules, 'import loopscale pulled torch'\n"
            "loopscale.LoopedConfig\n"
            "assert 'torch' in sys.modules\n"
            "print(sorted(loopscale.__all__)[:2])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "LawFit" in done.stdout
