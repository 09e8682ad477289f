"""A spec's own architecture through the real CLI: ``check-arch`` on a good one, and every bad factory (unknown
module or file, missing attribute, a factory that raises or returns no module, a forward of the wrong shape, a
parameter no forward reads) refused by ``plan`` and ``check-arch`` in one line naming it, exit 2, nothing written.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from loopscale.model import measured
from loopscale.model.architecture import fingerprint, source_files
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
    assert all(int(r[3].replace(",", "")) > 0 for r in looped) and "loss after 5 steps of the recipe (" in out


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


def test_a_helper_module_the_architecture_imports_is_part_of_its_source(tmp_path, monkeypatch):
    """An edit to a helper that the architecture file imports from its folder (here inside the factory) is a new
    architecture: new counts (not the cached old ones, which check-arch printed), a new sweep hash; a file in the
    folder that it does not import is not part of it."""
    (tmp_path / "widths.py").write_text("HIDDEN = 2\n")
    (tmp_path / "unrelated.py").write_text("X = 1\n")
    (tmp_path / "helped.py").write_text(FIXTURE.read_text() + '''

class Helped(TinyLoop):
    def __init__(self, config, hidden):
        super().__init__(config)
        self.extra, self.back = nn.Linear(config.width, hidden, bias=False), nn.Linear(hidden, config.width)

    def forward(self, idx, targets=None):
        x = self.prelude(self.embed(idx))
        x = x + self.back(self.extra(x))
        for _ in range(self.r):
            x = self.core(x)
        logits = self.head(self.norm(self.coda(x)))
        return logits if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.reshape(-1))


def helped(config):
    from widths import HIDDEN
    return Helped(config, HIDDEN)
''')
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = spec_file(tmp_path, template={"architecture": "helped.py:helped", "vocab_size": 64}, budgets=[1e12],
                     recurrences=[2], widths={"s_min": 1, "s_max": 1})
    first = SweepSpec.from_toml(spec).spec_hash
    config = SweepSpec.from_toml(spec).grid.model(1, 2)
    measured.cache_in(tmp_path / "cache")  # as a sweep or check-arch keeps them
    try:
        counts = []
        for hidden in (2, 3):
            (tmp_path / "widths.py").write_text(f"HIDDEN = {hidden}\n")
            monkeypatch.delitem(sys.modules, "widths", raising=False)  # a new process would import the edit
            counts.append(measured.measure(config).N_once)
    finally:
        measured.cache_in(None)
    assert counts[1] - counts[0] == 2 * config.width
    assert SweepSpec.from_toml(spec).spec_hash != first
    edited = SweepSpec.from_toml(spec).spec_hash
    (tmp_path / "unrelated.py").write_text("X = 2\n")
    assert SweepSpec.from_toml(spec).spec_hash == edited


@pytest.mark.parametrize("design", ["early_exit", "eval_exit"])
def test_check_arch_says_what_the_counter_cannot_see_when_compute_depends_on_the_data(workdir, capsys, design):
    """A loop that stops once every token has exited: in training mode one line and exit 2 (issue 63: a bare
    "Tensor.item() cannot be called on meta tensors"); in evaluation mode only, it trains at the counted depth
    (exit 0) and a line says its serving counts are not measured (issue 63: the full r, silently)."""
    shutil.copy(FIXTURE, workdir / "tiny_loop.py")
    shutil.copy(FIXTURE.with_name("red_team.py"), workdir / "red_team.py")
    spec = spec_file(workdir, template={"architecture": "red_team.py:build", "options": {"design": design}},
                     budgets=[1e12], recurrences=[2], widths={"s_min": 1, "s_max": 2})
    code = main(["check-arch", str(spec)])
    out, err = capsys.readouterr()
    if design == "early_exit":
        assert code == 2 and len(err.strip().splitlines()) == 1
        assert "in training mode reads a tensor's value" in err and "exit early only when not self.training" in err
    else:
        assert code == 0, err
        assert "serving counts not measured: " in out and "in evaluation mode reads a tensor's value" in out


def test_a_helper_loaded_however_the_file_loads_it_is_part_of_its_source(tmp_path):
    """Helpers no import statement names under the file's folder: a module of a folder the file puts on sys.path,
    one imported by a computed name, one loaded from its path. Each edit is a new architecture (issue 63: the old
    counts from the cache beside a check of the new model)."""
    (tmp_path / "lib").mkdir()
    helpers = [tmp_path / "lib" / "blocks.py", tmp_path / "named.py", tmp_path / "by_path.py"]
    for helper in helpers:
        helper.write_text("X = 1\n")
    (tmp_path / "loader.py").write_text(FIXTURE.read_text() + '''
import importlib, importlib.util, os, sys
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "lib"))
import blocks
sys.path.insert(0, HERE)
named = importlib.import_module("na" + "med")
_spec = importlib.util.spec_from_file_location("by_path_helper", os.path.join(HERE, "by_path.py"))
_spec.loader.exec_module(importlib.util.module_from_spec(_spec))
''')
    architecture = f"{tmp_path / 'loader.py'}:tiny_loop"
    try:
        before = fingerprint(architecture)
        assert {p.resolve() for p in helpers} <= set(source_files(architecture))
        for helper in helpers:
            helper.write_text(helper.read_text() + "# an edit\n")
            assert fingerprint(architecture) != before
            before = fingerprint(architecture)
    finally:
        for name in ("blocks", "named"):
            sys.modules.pop(name, None)
        for entry in (str(tmp_path / "lib"), str(tmp_path)):
            while entry in sys.path:
                sys.path.remove(entry)


def test_check_arch_steps_the_spec_s_recipe_and_names_a_parameter_it_cannot_move(workdir, capsys):
    """A zero-initialised gate matrix in the matrix group: MuonH holds every matrix at its initial norm, so the
    gate stays zero for ever (the AdamW steps check-arch took before passed it). check-arch steps the spec's
    optimizers and says so."""
    (workdir / "gated.py").write_text(FIXTURE.read_text() + '''

class Gated(TinyLoop):
    def __init__(self, config):
        super().__init__(config)
        self.gate = nn.Parameter(torch.zeros(config.width, config.width))

    def forward(self, idx, targets=None):
        x = self.prelude(self.embed(idx))
        for _ in range(self.r):
            x = self.core(x) + x @ self.gate
        logits = self.head(self.norm(self.coda(x)))
        return logits if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.reshape(-1))


def gated(config):
    return Gated(config)
''')
    template = {"architecture": "gated.py:gated", "vocab_size": 64}
    spec = spec_file(workdir, template=template, budgets=[1e12], recurrences=[2], widths={"s_min": 1, "s_max": 1},
                     recipe={"optimizer": "muonh"})
    assert main(["check-arch", str(spec)]) == 2
    captured = capsys.readouterr()
    assert "loss after 5 steps of the recipe (muonh) on one batch" in captured.out
    assert captured.err.splitlines() == [f"loopscale: error: architecture {workdir / 'gated.py'}:gated: 5 steps of "
                                         f"the recipe (muonh) leave 'gate' where it started: a matrix MuonH holds "
                                         f"at its initial norm (a zero one stays zero) belongs in "
                                         f"loopscale_param_groups()'s lanes"]
