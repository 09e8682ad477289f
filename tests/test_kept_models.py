"""Kept models (``[resources] keep_models``): the key, which trials a stage keeps, the model file of a trained
trial rebuilt at its own and at other recurrence counts, on real training (CPU, tiny shapes, the embedded KJV); a
tiny real sweep kept, reloaded and evaluated at other r through the CLI; the analysis of those evaluations."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from loopscale.analysis.store import trial_numbers
from loopscale.objectives import TrialConfig, train
from loopscale.objectives.kept import read_file, rebuild
from loopscale.objectives.training import validation_loss
from loopscale.objectives.trial import module_metrics
from loopscale.search import SweepSpec
from loopscale.search.tune.keep import kept_keys
from test_spec import write_spec

TEMPLATE = dict(depth=6, prelude=1, coda=1, width_unit=16, head_dim=16, seq_len=64, vocab_size=256,
                injection="linear")


def test_keep_models_defaults_to_best_is_checked_and_stays_out_of_the_hash(tmp_path):
    plain = SweepSpec.from_toml(write_spec(tmp_path))
    assert plain.placement.keep_models == "best"
    kept = SweepSpec.from_toml(write_spec(tmp_path, "all.toml", resources={"keep_models": "all"}))
    assert kept.placement.keep_models == "all" and kept.spec_hash == plain.spec_hash
    with pytest.raises(ValueError, match=r"bad.toml: \[resources\] keep_models must be one of 'best', 'all', 'none', "
                                         "got 'some'"):
        SweepSpec.from_toml(write_spec(tmp_path, "bad.toml", resources={"keep_models": "some"}))


def test_the_plan_says_what_keeping_costs(tmp_path):
    from loopscale.model import account
    from loopscale.search.plan.kept import kept_bytes_range
    from loopscale.search.plan.render import kept_line

    shapes = dict(objective="train", budgets=[4e9, 8e9], recurrences=[2], trials_per_cell=3, sampler="grid",
                  widths={"s_min": 1, "s_max": 3})
    best = SweepSpec.from_toml(write_spec(tmp_path, **shapes))
    size = {s: 4 * (account(best.grid.model(s, 2)).N + account(best.grid.model(s, 2)).N_embed) for s in (1, 2, 3)}
    narrow, wide = (sum(size[c.widths[end]] for c in best.cells()) for end in (0, -1))
    assert [c.widths[0] for c in best.cells()] == [1, 1] and narrow < wide  # the cells' widths reach past s = 1
    assert kept_bytes_range(best) == (2, narrow, wide)
    every = SweepSpec.from_toml(write_spec(tmp_path, "all.toml", resources={"keep_models": "all"}, **shapes))
    trials = [c.n_trials for c in every.cells()]
    ends = [sum(n * size[c.widths[end]] for n, c in zip(trials, every.cells())) for end in (0, -1)]
    assert kept_bytes_range(every) == (sum(trials), *ends)
    assert f"keep_models = 'all': every trial that ends ok): up to {sum(trials)}," in kept_line(every)
    none = SweepSpec.from_toml(write_spec(tmp_path, "none.toml", resources={"keep_models": "none"}, **shapes))
    simulated = SweepSpec.from_toml(write_spec(tmp_path, "sim.toml"))
    assert kept_bytes_range(none) == kept_bytes_range(simulated) == (0, 0, 0) and kept_line(none) == ""


def _result(key: str, cell: str, loss: float, status: str = "ok") -> dict:
    return {"trial_key": key, "cell": cell, "val_loss": loss, "status": status}


def test_a_stage_keeps_each_cells_best_every_ok_trial_or_none():
    results = [_result("s/a/1", "a", 3.0), _result("s/a/2", "a", 2.5), _result("s/a/3", "a", 1.0, "diverged"),
               _result("s/b/1", "b", float("nan")), _result("s/b/2", "b", 4.0), _result("s/c/1", "c", 2.0, "failed")]
    assert kept_keys(results, "best") == {"s/a/2", "s/b/2"}
    assert kept_keys(results, "all") == {"s/a/1", "s/a/2", "s/b/2"}
    assert kept_keys(results, "none") == set()
    tied = [_result("s/a/2", "a", 2.0), _result("s/a/1", "a", 2.0)]
    assert kept_keys(tied, "best") == {"s/a/1"}


def kept(data: bytes) -> tuple[TrialConfig, dict]:
    """The trial and weights of a model file this test made (a file of its own, trusted: nothing to check)."""
    params, weights = read_file(data, "the file")
    return TrialConfig.from_params(params), weights


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A d = 32, r = 2 trial trained to 4e9 FLOPs, with the model file it handed to ``keep``."""
    cache = str(tmp_path_factory.mktemp("kept-cache"))
    trial = TrialConfig(budget_flops=4e9, s=2.0, r=2, template=TEMPLATE, batch_tokens=512, data={"source": "kjv"},
                        cache_dir=cache, val_tokens=2048, num_threads=1, recipe={"log_every": 2})
    files: list[bytes] = []
    metrics = train(trial, keep=files.append)
    return trial, metrics, files


def test_a_kept_model_reproduces_its_trials_validation_loss(trained):
    trial, metrics, files = trained
    assert metrics["status"] == "ok" and len(files) == 1
    params, weights = read_file(files[0], "the file")
    kept_trial = TrialConfig.from_params(params)
    assert kept_trial == trial
    assert validation_loss(rebuild(kept_trial, weights), kept_trial, "cpu") == pytest.approx(metrics["val_loss"],
                                                                                              abs=1e-6)


def test_the_built_in_runs_its_trained_block_more_or_fewer_times(trained):
    trial, metrics, files = trained
    kept_trial, weights = kept(files[0])
    deeper = rebuild(kept_trial, weights, r=4)
    assert deeper.config.r == 4 and deeper.config.n_recur == trial.model_config.n_recur
    passes, block_runs = [], []
    deeper.prelude[0].register_forward_hook(lambda *_: passes.append(1))
    deeper.core[0].register_forward_hook(lambda *_: block_runs.append(1))
    loss = validation_loss(deeper, kept_trial, "cpu")
    assert math.isfinite(loss) and len(passes) >= 1 and len(block_runs) == 4 * len(passes)
    once = rebuild(kept_trial, weights, r=1)  # the loop once: injection, block and recurrence norm
    injected, block_runs = [], []
    once.looped.inject.register_forward_hook(lambda *_: injected.append(1))
    once.looped.core[0].register_forward_hook(lambda *_: block_runs.append(1))
    assert validation_loss(once, kept_trial, "cpu") != loss
    assert len(injected) == len(block_runs) == len(passes)


def test_a_diverged_trial_keeps_nothing(tmp_path):
    trial = TrialConfig(budget_flops=4e9, s=2.0, r=2, template=TEMPLATE, batch_tokens=512, data={"source": "kjv"},
                        cache_dir=str(tmp_path), val_tokens=2048, num_threads=1,
                        recipe={"log_every": 1, "head_lr": 1e4, "ref_batch": 512})
    files: list[bytes] = []
    assert train(trial, keep=files.append)["status"] == "diverged" and files == []


GATED = """
import torch
from loopscale.model.looped import LoopedLM


class Gated(LoopedLM):
    def __init__(self, config):
        super().__init__(config)
        self.gate = torch.nn.Parameter(torch.zeros(()))

    def forward(self, idx, targets=None):
        out = super().forward(idx, targets)
        return out + 0.0 * self.gate if targets is not None else out

    def loopscale_roles(self):
        return {"gate": "once"}

    def loopscale_param_groups(self):
        groups = LoopedLM.param_groups(self)
        groups["matrices"] = [p for p in groups["matrices"] if p is not self.gate]
        return {**groups, "lanes": [*groups["lanes"], self.gate]}

    def loopscale_metrics(self):
        return {"gate": self.gate.detach(), "recurrences": self.config.r}


def build(config):
    return Gated(config)
"""


def test_a_modules_own_metrics_are_returned_by_its_trial_and_measured_at_any_r(tmp_path):
    (tmp_path / "gated.py").write_text(GATED)
    template = {**TEMPLATE, "architecture": f"{tmp_path}/gated.py:build"}
    trial = TrialConfig(budget_flops=4e9, s=2.0, r=2, template=template, batch_tokens=512, data={"source": "kjv"},
                        cache_dir=str(tmp_path), val_tokens=2048, num_threads=1)
    files: list[bytes] = []
    metrics = train(trial, keep=files.append)
    assert metrics["status"] == "ok" and metrics["module.recurrences"] == 2.0 and math.isfinite(metrics["module.gate"])
    kept_trial, weights = kept(files[0])
    assert module_metrics(rebuild(kept_trial, weights, r=3)) == {"module.gate": metrics["module.gate"],
                                                                  "module.recurrences": 3.0}
    # the factory is asked at r = 1 (a plain stack's config); this module's r = 1 has no injection to take
    with pytest.raises(ValueError, match=r"^cannot evaluate at r=1: the module built at r=1 does not take the "
                                         r"weights trained at r=2 \(Unexpected key\(s\) in state_dict: \"inject"):
        rebuild(kept_trial, weights, r=1)
    with pytest.raises(ValueError, match="^loopscale_metrics\\(\\) must return numbers, got 'open' for 'gate'"):
        module_metrics(type("M", (), {"loopscale_metrics": lambda self: {"gate": "open"}})())


def test_a_file_that_is_no_model_is_one_line(tmp_path):
    with pytest.raises(ValueError, match="^x.pt is not a loopscale model file"):
        read_file(b"not a model", "x.pt")


@pytest.mark.integration
@pytest.mark.slow
def test_a_sweep_keeps_each_cells_best_model_which_reloads_and_evaluates_at_every_r(tmp_path, capsys):
    import ray
    from mlflow.tracking import MlflowClient

    from loopscale import load_model, load_runs
    from loopscale.analysis.depth import depth_table, depth_text
    from loopscale.analysis.plots import depth_figure
    from loopscale.model import account
    from loopscale.search.cli import main
    from loopscale.search.tracking import KEPT_TAG

    path = write_spec(tmp_path, objective="train", budgets=[4e9], recurrences=[2], trials_per_cell=2, sampler="grid",
                      val_tokens=2048, data={"source": "kjv"}, recipe={"log_every": 2},
                      widths={"s_min": 1, "s_max": 3}, resources={"checkpoint_s": 0})
    spec = SweepSpec.from_toml(path)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        assert main(["search", str(path)]) == 0
    finally:
        ray.shutdown()
    client = MlflowClient(spec.placement.tracking_uri)
    experiment = client.get_experiment_by_name(spec.name)
    runs = client.search_runs([experiment.experiment_id], "tags.`loopscale.kind` = 'trial'")
    assert len(runs) == 2 and all(r.data.tags["status"] == "ok" for r in runs)
    best = min(runs, key=lambda r: r.data.metrics["val_loss"])
    assert [r.info.run_id for r in runs if r.data.tags.get(KEPT_TAG)] == [best.info.run_id]
    [artifact] = client.list_artifacts(best.info.run_id)
    assert artifact.path == "model.pt"
    counts = account(spec.grid.model(float(best.data.params["s"]), 2))
    estimate = 4 * (counts.N + counts.N_embed)  # the plan's figure (search/plan/kept.py)
    assert estimate < artifact.file_size < estimate * 1.05 + 20_000
    assert not list((tmp_path / "tune").rglob("*.model.pt"))  # the trial's own copies are gone once kept

    kept = load_model(best.info.run_id, spec.placement.tracking_uri)
    assert kept.config == spec.grid.model(float(best.data.params["s"]), 2)
    assert kept.validation_loss() == pytest.approx(best.data.metrics["val_loss"], abs=1e-6)
    with pytest.raises(ValueError, match="holds no kept model"):
        load_model(next(r for r in runs if r is not best), spec.placement.tracking_uri)

    capsys.readouterr()
    assert main(["evaluate", spec.name, "--r", "1,2,3,4,8", "--tracking-uri", spec.placement.tracking_uri]) == 0
    out, err = capsys.readouterr()
    metrics = trial_numbers(client.get_run(best.info.run_id))
    assert {f"val_loss_r{r}" for r in (1, 2, 3, 4, 8)} <= set(metrics)
    assert metrics["val_loss_r2"] == pytest.approx(metrics["val_loss"], abs=1e-6)
    assert all(math.isfinite(metrics[f"val_loss_r{r}"]) for r in (1, 3, 4, 8))
    assert "cannot evaluate" not in err and best.info.run_name[:32] in out

    # analyze's table and figure of the evaluations, from the runs table read back from MLflow
    depth = depth_table(load_runs(spec.name, spec.placement.tracking_uri))
    assert list(depth["r_eval"]) == [1, 2, 3, 4, 8] and set(depth["run_id"]) == {best.info.run_id}
    assert depth.loc[depth["r_eval"] == 2, "gain"].abs().max() < 1e-6
    assert list(depth["gain"]) == [metrics["val_loss"] - metrics[f"val_loss_r{r}"] for r in (1, 2, 3, 4, 8)]
    assert depth_text(depth).startswith("1 kept models evaluated at other r") and "r=2 at 8: " in depth_text(depth)
    assert len(depth_figure(depth).axes[0].lines) == 1

    assert main(["evaluate", spec.name, "--r", "2,x", "--tracking-uri", spec.placement.tracking_uri]) == 2
    assert "--r must list distinct whole recurrence counts from 1 to 1,024" in capsys.readouterr().err


def test_analyze_tabulates_and_plots_the_evaluations_at_other_r(tmp_path, capsys):
    from loopscale.search.cli import main
    from test_analysis_sim import paper_runs

    runs = paper_runs(noise=0.01)
    evaluated = runs[runs["r"] == 2].groupby("budget_flops")["val_loss"].idxmin()  # each r = 2 cell's best
    for r_eval, shift in ((2, 0.0), (4, 0.03), (8, -0.02)):
        runs.loc[evaluated, f"val_loss_r{r_eval}"] = runs.loc[evaluated, "val_loss"] - shift
    runs.to_csv(tmp_path / "sweep.csv", index=False)
    out = tmp_path / "out"
    assert main(["analyze", "--experiment", str(tmp_path / "sweep.csv"), "--out", str(out), "--n-starts", "20",
                 "--n-bootstrap", "10"]) == 0
    table = pd.read_csv(out / "tables" / "depth_eval.csv")
    assert len(table) == 3 * len(evaluated) and set(table["r"]) == {2}
    assert table.groupby("r_eval")["gain"].mean().round(9).to_dict() == {2: 0.0, 4: 0.03, 8: -0.02}
    assert (out / "plots" / "loss_vs_r_eval.png").is_file()
    assert f"mean gain over the trained r in nats (models): r=2 at 4: +0.0300 ({len(evaluated)}), r=2 at 8: -0.0200" \
        in " ".join(capsys.readouterr().out.split())


def test_keeping_survives_a_crash_between_upload_and_delete_with_one_copy(tmp_path):
    """The driver's half against a real sqlite store: the kept file uploaded, every file then deleted; a crash
    before the delete (the files still there) uploads again to the same artifact path; a resume after the
    delete finds nothing to do and loses nothing."""
    from mlflow.tracking import MlflowClient

    from loopscale.search.tracking import KEPT_TAG, open_sweep
    from loopscale.search.tune.keep import keep_models
    from loopscale.search.tune.receipts import model_file
    from test_search_tracking import config, tracker

    spec = SweepSpec.from_toml(write_spec(tmp_path))
    experiment_id, parent = open_sweep(spec, "simulated")
    logger = tracker(spec, experiment_id, parent)
    folder = str(tmp_path / "models")
    results = []
    for n, loss in ((1, 3.0), (2, 2.5)):
        key = f"search/a/{n}"
        trial = config(n + 1)
        logger.start(key, {"stage": "search", "cell": "a"}, trial)
        logger.finish(key, {"val_loss": loss, "steps": 7, "tokens": 3584, "status": "ok", "reason": ""})
        results.append({"trial_key": key, "cell": "a", "val_loss": loss, "status": "ok", "trial": trial.to_params()})

    def write_files() -> None:
        for r in results:
            model_file(folder, r["trial_key"], r["trial"]).write_bytes(f"weights of {r['trial_key']}".encode())

    def kept() -> dict[str, list]:
        client = MlflowClient(spec.placement.tracking_uri)
        out = {}
        for run in client.search_runs([experiment_id], "tags.`loopscale.kind` = 'trial'"):
            out[run.data.tags["trial_key"]] = [(a.path, a.file_size) for a in client.list_artifacts(run.info.run_id)]
            assert bool(run.data.tags.get(KEPT_TAG)) == bool(out[run.data.tags["trial_key"]])
        return out

    write_files()
    assert keep_models(logger, results, folder, "best") == 1
    uploaded = {"search/a/1": [], "search/a/2": [("model.pt", len(b"weights of search/a/2"))]}
    assert kept() == uploaded and not list((tmp_path / "models").iterdir())
    write_files()  # a crash after the upload, before the delete: the files are all still there
    assert keep_models(logger, results, folder, "best") == 1
    assert kept() == uploaded and not list((tmp_path / "models").iterdir())
    assert keep_models(logger, results, folder, "best") == 0  # resumed after the delete: nothing left to do
    assert kept() == uploaded


def test_evaluate_refuses_bad_input_in_one_line_before_any_work(tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    from loopscale.search.cli import main
    from loopscale.search.tracking import KEPT_TAG

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("gone")
    run = client.create_run(experiment, tags={"loopscale.kind": "trial", KEPT_TAG: "model.pt"})
    client.log_param(run.info.run_id, "template.architecture", f"{tmp_path}/gone.py:build")
    capsys.readouterr()  # MLflow's own lines as it creates the store
    for argv, message in ((["gone", "--r", "0,2"], "--r must list distinct whole recurrence counts from 1 to"),
                          (["missing", "--r", "2"], "no experiment 'missing' in the MLflow store"),
                          (["gone", "--r", "2"], f"architecture '{tmp_path}/gone.py:build'")):
        assert main(["evaluate", *argv, "--tracking-uri", uri]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert trial_numbers(client.get_run(run.info.run_id)) == {}


MODED = """
from loopscale.model.looped import LoopedLM


class Moded(LoopedLM):
    '''Its loss is 1 nat higher in training mode; it counts the forwards it runs in evaluation mode.'''

    def __init__(self, config):
        super().__init__(config)
        self.evaluated = 0

    def forward(self, idx, targets=None):
        out = super().forward(idx, targets)
        self.evaluated += not self.training
        return out + 1.0 if targets is not None and self.training else out

    def loopscale_metrics(self):
        return {"evaluated": self.evaluated}

    def loopscale_metrics_reset(self):
        self.evaluated = 0


def build(config):
    return Moded(config)
"""


def test_validation_runs_in_evaluation_mode_and_metrics_describe_the_last_evaluation_alone(tmp_path):
    """In a trial (with a warmdown branch evaluated before its end) and of its kept model, validation runs the
    module in evaluation mode: one val_loss for a module that branches on self.training (issue 63: in-trial
    validation ran in training mode), and loopscale_metrics() after loopscale_metrics_reset() counts the last
    evaluation's forwards only, not the branch's too."""
    (tmp_path / "moded.py").write_text(MODED)
    template = {**TEMPLATE, "architecture": f"{tmp_path}/moded.py:build"}
    trial = TrialConfig(budget_flops=4e9, s=2.0, r=2, template=template, batch_tokens=512, data={"source": "kjv"},
                        cache_dir=str(tmp_path), val_tokens=2048, num_threads=1,
                        recipe={"schedule": "wsd", "branch_budgets": [2e9]})
    files: list[bytes] = []
    metrics = train(trial, keep=files.append)
    assert metrics["status"] == "ok" and "branch0.val_loss" in metrics
    chunks = 2048 // 64 // (512 // 64)  # the validation rows in micro-batches of a step's rows
    assert metrics["module.evaluated"] == chunks
    kept_trial, weights = kept(files[0])
    model = rebuild(kept_trial, weights)
    assert validation_loss(model, kept_trial, "cpu") == pytest.approx(metrics["val_loss"], abs=1e-6)
    assert module_metrics(model) == {"module.evaluated": chunks}
