"""A spec's own architecture through the real CLI: ``check-arch`` on a good one, and every bad factory (unknown
module or file, missing attribute, a factory that raises or returns no module, a forward of the wrong shape, a
parameter no forward reads) refused by ``plan`` and ``check-arch`` in one line naming it, exit 2, nothing written.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from loopscale.search import SweepSpec
from loopscale.search.cli import main
from test_bad_input import refuses, spec_file, workdir  # noqa: F401 (a fixture)

FIXTURE = Path(__file__).parent / "fixtures" / "tiny_loop.py"


def arch_spec(root: Path, architecture: str, **options) -> Path:
    """A small simulated spec in ``root`` naming ``architecture`` (the fixture copied next to it)."""
    shutil.copy(FIXTURE, root / "tiny_loop.py")
    template = {"architecture": architecture, **({"options": options} if options else {})}
    return spec_file(root, template=template, budgets=[1e12], recurrences=[1, 2], widths={"s_min": 1, "s_max": 4})


BAD = [
    ("no_such_package_xyz:build", {}, "cannot import 'no_such_package_xyz'"),
    ("missing.py:tiny_loop", {}, "missing.py:tiny_loop': no file"),
    ("tiny_loop.py:nope", {}, "has no callable 'nope'"),
    ("tiny_loop.py:raises", {}, "the factory failed: RuntimeError: width too small for this design"),
    ("tiny_loop.py:not_a_module", {}, "the factory returned a dict, not a torch.nn.Module"),
    ("tiny_loop.py:wrong_shape", {}, "forward(idx) returned (1, 64), expected logits of shape (1, 64, "),
    ("tiny_loop.py:tiny_loop", {"unused": True}, "parameter 'spare.weight' is read by no forward"),
    ("tiny_loop.py:tiny_loop", {"colour": "red"}, "unexpected keyword argument 'colour'"),
    ("tiny_loop.py", {}, "must read \"package.module:factory\""),
]


@pytest.mark.parametrize("command", ["plan", "check-arch"])
@pytest.mark.parametrize("architecture,options,message", BAD)
def test_a_bad_factory_is_one_line_naming_it(workdir, capsys, command, architecture, options, message):
    spec = arch_spec(workdir, architecture, **options)
    err = refuses([command, str(spec)], workdir, capsys, message)
    assert architecture.partition(":")[0].removesuffix(".py") in err


@pytest.mark.parametrize("command", ["plan", "check-arch"])
@pytest.mark.parametrize("where", ["factory", "import"])
def test_an_architecture_calling_sys_exit_is_one_line_not_a_quiet_success(workdir, capsys, command, where):
    """sys.exit(0) in the user's file or factory ended the command with exit 0, no output and nothing done: a
    batch job would take the sweep as done."""
    source = FIXTURE.read_text() + ("\nimport sys\nsys.exit(0)\n" if where == "import" else
                                    "\n\ndef exits(config, **options):\n    import sys\n    sys.exit(0)\n")
    (workdir / "quits.py").write_text(source)
    spec = spec_file(workdir, template={"architecture": f"quits.py:{'exits' if where == 'factory' else 'tiny_loop'}"},
                     budgets=[1e12], recurrences=[1, 2], widths={"s_min": 1, "s_max": 4})
    err = refuses([command, str(spec)], workdir, capsys, "sys.exit(0) was called")
    assert "quits.py" in err


@pytest.mark.parametrize("command", ["plan", "check-arch"])
@pytest.mark.parametrize("stem, why", [("json", "a module of Python's standard library"),
                                       ("typing", "a module of Python's standard library"),
                                       ("loopscale", "loopscale's own package"),
                                       ("numpy", "a module already importable from ")])
def test_an_architecture_file_named_like_a_module_is_refused(workdir, capsys, command, stem, why):
    """A Ray worker imports the file by its name: ``json.py`` shadowed the standard library's json there (the
    search hung with its banner printed), ``loopscale.py`` the package (a traceback, a sweep run left RUNNING)."""
    shutil.copy(FIXTURE, workdir / f"{stem}.py")
    spec = spec_file(workdir, template={"architecture": f"{stem}.py:tiny_loop"}, budgets=[1e12], recurrences=[1, 2],
                     widths={"s_min": 1, "s_max": 4})
    err = refuses([command, str(spec)], workdir, capsys, f"{stem}.py is named like {why}")
    assert "rename the file" in err


def test_check_arch_reports_counts_per_r_and_passes_a_good_architecture(workdir, capsys):
    spec = arch_spec(workdir, "tiny_loop.py:tiny_loop", adapters=2)
    assert main(["check-arch", str(spec)]) == 0
    out = capsys.readouterr().out
    loaded = SweepSpec.from_toml(spec)
    assert loaded.grid.template["architecture"] == f"{workdir / 'tiny_loop.py'}:tiny_loop"  # made absolute
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["2"])]
    assert [(int(r[0]), int(r[1])) for r in rows] == [(1, 16), (1, 64), (2, 16), (2, 64)]
    looped = [r for r in rows if r[0] == "2"]
    assert all(int(r[3].replace(",", "")) > 0 for r in looped) and "loss after 5 AdamW steps" in out


def test_check_arch_names_each_problem_in_one_line(workdir, capsys):
    (workdir / "untrained.py").write_text(FIXTURE.read_text() + '''

class Detached(TinyLoop):
    def forward(self, idx, targets=None):
        with torch.no_grad():
            x = self.prelude(self.embed(idx))
        logits = self.head(self.norm(self.coda(self.core(x)))) * 1e3
        return logits if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.reshape(-1))


def detached(config):
    return Detached(config)
''')
    spec = spec_file(workdir, template={"architecture": "untrained.py:detached"}, budgets=[1e12], recurrences=[2],
                     widths={"s_min": 1, "s_max": 2})
    assert main(["check-arch", str(spec)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(line.startswith("loopscale: error: architecture ") for line in err), err
    assert "loss at init" in err[0] and "no gradient reaches 'embed.weight' (and " in err[1]


def test_set_names_the_architecture_as_it_names_any_key(workdir):
    spec = spec_file(workdir, budgets=[1e12], recurrences=[2], widths={"s_min": 1, "s_max": 4})
    shutil.copy(FIXTURE, workdir / "tiny_loop.py")
    plain = SweepSpec.from_toml(spec)
    named = SweepSpec.from_toml(spec, [f"template.architecture={workdir / 'tiny_loop.py'}:tiny_loop"])
    assert named.grid.template["architecture"].endswith("tiny_loop.py:tiny_loop")
    assert "architecture" not in plain.grid.template
    assert named.spec_hash != plain.spec_hash
    builtin = SweepSpec.from_toml(spec, ["template.architecture=loopscale:looped"])
    assert builtin.spec_hash == plain.spec_hash  # naming the default is not setting anything
    trial = named.trial_config(named.cells()[0], named.cells()[0].widths[0])
    assert trial.model_config.architecture == named.grid.template["architecture"]
    assert SweepSpec.from_toml(spec, [f"template.architecture={workdir / 'tiny_loop.py'}:tiny_loop",
                                      "template.options.adapters=2"]).spec_hash != named.spec_hash


def test_the_hash_follows_the_architecture_s_source_not_its_folder(tmp_path):
    """The same spec and file in another folder (another checkout) resume as the same sweep; an edited file is
    another architecture, so a sweep started before the edit refuses to resume after it."""
    hashes = []
    for folder in ("one", "elsewhere/two"):
        (tmp_path / folder).mkdir(parents=True)
        hashes.append(SweepSpec.from_toml(arch_spec(tmp_path / folder, "tiny_loop.py:tiny_loop")).spec_hash)
    assert hashes[0] == hashes[1]
    edited = tmp_path / "one" / "tiny_loop.py"
    edited.write_text(edited.read_text() + "\n# an edit\n")
    assert SweepSpec.from_toml(tmp_path / "one" / "spec.toml").spec_hash != hashes[0]
