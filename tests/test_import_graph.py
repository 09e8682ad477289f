"""The import graph of the package, read from the source (ast): no cycle between modules (so none inside any
folder), and imports one way: search -> objectives -> model, analysis -> model, and inside objectives/data/ along
the pipeline (spec -> ... -> batches); model needs only torch; Ray is imported only inside the package
search/tune/ (its APIs churn), Optuna only there and in the law sampler (search/law_sampler.py); analysis never
imports Ray. The Optuna studies and the law sampler load without Ray: checked in a fresh interpreter, where
``sys.modules`` says what really got imported.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]  # the folders model/, search/, ... are the subpackages of ``loopscale``
PACKAGES = ("model", "objectives", "analysis", "search")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = ("loopscale", *path.relative_to(ROOT).with_suffix("").parts)
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _runtime_nodes(tree: ast.AST):
    """Every node except those under ``if TYPE_CHECKING:`` (annotations only; nothing runs them)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        yield node
        yield from _runtime_nodes(node)


def imports_of(name: str) -> set[str]:
    """What module ``name`` imports, at any depth (a function's lazy import is still an import): modules of the
    package by full name, anything else by its top-level name."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            # ``from pkg import sub`` imports the submodule when there is one
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        found |= {t if t.startswith("loopscale") else t.split(".")[0] for t in targets}
    return found - {"__future__"}


GRAPH = {name: imports_of(name) for name in MODULES}


def test_the_graph_was_read():
    assert len(MODULES) > 40 and "loopscale.search.tune.driver" in MODULES
    assert {"loopscale.search.tune.stage", "ray"} <= GRAPH["loopscale.search.tune.driver"]
    assert "loopscale.search.tune.live" in GRAPH["loopscale.search.tune.callbacks"]  # ``from . import live``
    assert "loopscale.search.space" in GRAPH["loopscale.search.spec"]  # ``from . import space``
    assert "loopscale.search.spec" not in GRAPH["loopscale.search.space"]  # under TYPE_CHECKING only


def test_no_cycle_between_modules():
    """Depth-first search; a back edge to a module on the current path is a cycle, reported as its path."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        path.append(name)
        for target in sorted(GRAPH[name] & MODULES.keys()):
            if state.get(target) == 1:
                cycle = path[path.index(target):] + [target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        path.pop()
        state[name] = 2

    for name in sorted(MODULES):
        if name not in state:
            visit(name)


def _third_party(name: str) -> set[str]:
    return {t for t in GRAPH[name] if not t.startswith("loopscale") and t not in sys.stdlib_module_names}


ALLOWED_PACKAGES = {  # which of loopscale's packages each may import
    "model": {"model"},
    "objectives": {"objectives", "model"},
    "analysis": {"analysis", "model"},
    "search": {"search", "objectives", "model", "analysis"},
}


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_go_one_way(package):
    for name in (n for n in MODULES if n.split(".")[1] == package):
        used = {t.split(".")[1] for t in GRAPH[name] if t.startswith("loopscale.")}
        assert used <= ALLOWED_PACKAGES[package], f"{name} imports loopscale.{sorted(used - ALLOWED_PACKAGES[package])}"
        assert "loopscale" not in GRAPH[name], f"{name} imports the top-level package (it imports every room lazily)"


DATA = "loopscale.objectives.data"
# The data pipeline's modules in the order the data flows (objectives/data/__init__.py): each may import only the
# ones before it, so no stage calls back up. A new module must take its place here.
DATA_STAGES = ("spec", "synthetic", "sources", "tokenizers", "bpe", "cache", "batches")


def test_the_data_pipeline_imports_one_way():
    stages = [f"{DATA}.{stage}" for stage in DATA_STAGES]
    assert {n for n in MODULES if n.startswith(DATA + ".")} == set(stages), "a data module is not in DATA_STAGES"
    assert f"{DATA}.spec" in GRAPH[f"{DATA}.tokenizers"]  # the relative imports were read
    assert not GRAPH[DATA] & set(stages), f"{DATA}/__init__.py imports its stages: reading the spec loads them all"
    for i, name in enumerate(stages):
        later = GRAPH[name] & set(stages[i + 1:])
        assert not later, f"{name} imports {sorted(later)}, later in the pipeline"


def test_model_needs_only_torch():
    for name in (n for n in MODULES if n.startswith("loopscale.model")):
        assert _third_party(name) <= {"torch"}, f"{name} imports {sorted(_third_party(name) - {'torch'})}"


TUNE = "loopscale.search.tune"
HOMES = {"ray": (TUNE,), "optuna": (TUNE, "loopscale.search.law_sampler")}  # modules, or packages with theirs


def _inside(name: str, homes: tuple[str, ...]) -> bool:
    return any(name == home or name.startswith(home + ".") for home in homes)


@pytest.mark.parametrize("library", sorted(HOMES))
def test_ray_and_optuna_stay_in_their_homes(library):
    users = {name for name in MODULES if library in GRAPH[name]}
    assert users, f"no module imports {library}: the graph was misread"
    strays = sorted(name for name in users if not _inside(name, HOMES[library]))
    assert not strays, f"{library} imported by {strays}"


def test_the_studies_and_the_law_sampler_load_without_ray():
    """In a fresh interpreter (this one may hold Ray already): importing them imports no Ray, at any depth."""
    modules = [f"{TUNE}.studies", f"{TUNE}.cells", "loopscale.search.law_sampler", "loopscale.search.dispatch"]
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
    code += "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", f"importing {modules} imported Ray: {done.stdout.strip()[:300]}"


def test_a_simulated_trial_runs_without_torch():
    """A simulated trial (and its warmdown branches) reads the recipe's schedule alone: no torch, whose import
    costs each Ray trial process about a second; training and building optimizers still import it."""
    code = ("import sys\nfrom loopscale.objectives import TrialConfig, simulate\n"
            "template = dict(depth=6, prelude=1, coda=1, width_unit=16, head_dim=16, seq_len=64, vocab_size=256)\n"
            "trial = TrialConfig(budget_flops=1e12, r=2, s=2.0, template=template, batch_tokens=512,"
            " objective='simulate', branch_budgets=(5e11,))\n"
            "result = simulate(trial)\n"
            "print(result['status'], 'branch0.val_loss' in result, 'torch' in sys.modules)\n"
            "from loopscale.objectives.recipe import normalize_recipe\n"
            "print(normalize_recipe({})['optimizer'] in ('muon', 'adamw'), 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["ok True False", "True True"], done.stdout
