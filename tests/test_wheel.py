"""A wheel install starts: what an index or ``pip install git+...`` gives a user, not the editable install every
other test uses. The package list in pyproject.toml must name every folder that holds an ``__init__.py`` (a
subpackage left out is missing from the wheel, and the CLI fails on its first import), and a wheel built from the
tracked files, installed in a fresh environment, runs ``loopscale --help`` and ``loopscale plan smoke`` from a
folder outside the checkout."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from test_checkout_name import sees_this_interpreters_packages

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def packages_in_the_tree() -> set[str]:
    found = set()
    for name, folder in PROJECT["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *parts)))
    return found


def test_the_package_list_names_every_folder_of_the_tree():
    assert set(PROJECT["packages"]) == packages_in_the_tree()


@pytest.mark.integration
def test_a_wheel_built_from_the_tracked_files_runs_outside_the_checkout(tmp_path):
    clean = tmp_path / "loopscale-main"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for rel in filter(None, tracked.decode().split("\0")):
        source = ROOT / rel
        if source.is_file():  # a tracked file deleted in the working tree is not in a clean clone's wheel either
            (clean / rel).parent.mkdir(parents=True, exist_ok=True)
            (clean / rel).write_bytes(source.read_bytes())

    def run(*cmd, cwd):
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{cmd}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
        return done.stdout

    wheels = tmp_path / "wheels"
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
        "--disable-pip-version-check", "--wheel-dir", str(wheels), str(clean), cwd=tmp_path)
    (wheel,) = wheels.glob("loopscale-*.whl")
    python = sees_this_interpreters_packages(tmp_path / "venv")
    run(sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
        "--disable-pip-version-check", str(wheel), cwd=tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = run(str(python), "-c", "import loopscale.search.cli as c; print(c.__file__)", cwd=elsewhere)
    assert "site-packages" in where and not Path(where.strip()).is_relative_to(ROOT)
    console = tmp_path / "venv" / "bin" / "loopscale"
    assert "usage: loopscale" in run(str(console), "--help", cwd=elsewhere)
    plan = run(str(console), "plan", "smoke", cwd=elsewhere)
    assert "sweep 'smoke'" in plan and "C=1e+12,r=1" in plan, plan[-2000:]
