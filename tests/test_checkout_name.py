"""The README's commands work in a checkout of any folder name: GitHub's zip unpacks as ``loopscale-main``, which
is no Python identifier. The repository root is therefore no package (``loopscale/__init__.py`` is the namespace,
the top-level folders its subpackages, mapped in pyproject.toml), so pytest never imports the root by its name."""

import shutil
import site
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP = shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", ".pytest_cache", ".hypothesis", "mlruns",
                              "loopscale-runs", ".venv", "test-artifacts", "build", "site")


def sees_this_interpreters_packages(env_dir: Path) -> Path:
    """A new venv whose imports find what this interpreter finds (what tests/run.sh installed: the README's
    `pip install`, setuptools among it), standing in for the install, so that only loopscale itself is new there.
    Not ``system_site_packages``: that is the BASE interpreter's folder, which inside a virtual environment is
    not where the project's packages were installed. The folders are listed in a .pth file as plain paths, so
    their own .pth files (this interpreter's editable loopscale) are not run there. Returns its python."""
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    ours = dict.fromkeys([*site.getsitepackages(), sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    (Path(purelib) / "this_interpreters_packages.pth").write_text("".join(f"{folder}\n" for folder in ours))
    return python


@pytest.mark.integration
def test_a_checkout_named_loopscale_main_installs_runs_its_cli_and_collects_its_tests(tmp_path):
    checkout = tmp_path / "loopscale-main"
    shutil.copytree(ROOT, checkout, ignore=SKIP)
    env_dir = tmp_path / "venv"
    python = sees_this_interpreters_packages(env_dir)

    def run(*cmd):
        done = subprocess.run(cmd, cwd=checkout, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{cmd}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
        return done.stdout

    run(sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
        "--no-build-isolation", "--disable-pip-version-check", "-e", ".")
    where = run(str(python), "-c", "import loopscale.search.cli as c; print(c.__file__)")
    assert Path(where.strip()).is_relative_to(checkout)
    assert "usage: loopscale" in run(str(env_dir / "bin" / "loopscale"), "--help")
    out = run(str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_namespace.py",
              "tests/test_spec.py::test_presets_load")
    assert " passed" in out and "error" not in out.lower()
