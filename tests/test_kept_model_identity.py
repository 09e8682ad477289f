"""A kept model's file is built only as its run records it (search/models.py): a forged file naming other code is
refused before anything is imported, two runs' files exchanged are refused for both, a damaged file is skipped by
``loopscale evaluate`` in one line; and the recurrence counts evaluation takes. Real training (CPU, tiny shapes,
the embedded KJV) kept into a real sqlite MLflow store through the driver's own half (``keep_models``), no Ray."""

from __future__ import annotations

import hashlib
import io
import math
from pathlib import Path

import pytest
import torch

from loopscale.analysis.store import trial_numbers
from loopscale.objectives import TrialConfig, train
from loopscale.objectives.kept import MAX_EVAL_R, rebuild
from loopscale.search import SweepSpec
from test_kept_models import TEMPLATE
from test_spec import write_spec

MARKER = """
from pathlib import Path

Path({mark!r}).write_text("imported")


def build(config, **options):
    Path({mark!r}).write_text("built")
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The model files of two real trials, r = 1 and r = 2, as their trials handed them to ``keep``."""
    cache = str(tmp_path_factory.mktemp("identity-cache"))
    out = {}
    for r in (1, 2):
        trial = TrialConfig(budget_flops=4e9, s=2.0, r=r, template=TEMPLATE, batch_tokens=512, data={"source": "kjv"},
                            cache_dir=cache, val_tokens=2048, num_threads=1, recipe={"log_every": 2})
        kept: list[bytes] = []
        metrics = train(trial, keep=kept.append)
        assert metrics["status"] == "ok" and len(kept) == 1
        out[r] = (trial, metrics, kept[0])
    return out


def kept_store(tmp_path, files):
    """A sweep "t" whose two trial runs hold the files of ``files`` as the driver keeps them; (spec, client,
    {r: run id})."""
    from mlflow.tracking import MlflowClient

    from loopscale.search.tracking import open_sweep
    from loopscale.search.tune.keep import keep_models
    from loopscale.search.tune.receipts import model_file
    from test_search_tracking import tracker

    spec = SweepSpec.from_toml(write_spec(tmp_path))
    experiment_id, parent = open_sweep(spec, "kjv")
    logger = tracker(spec, experiment_id, parent)
    folder, results = str(tmp_path / "models"), []
    for r, (trial, metrics, data) in files.items():
        key = f"search/c{r}/1"
        logger.start(key, {"stage": "search", "cell": f"c{r}"}, trial)
        model_file(folder, key, trial.to_params()).write_bytes(data)
        logger.finish(key, metrics)
        results.append({"trial_key": key, "cell": f"c{r}", "val_loss": metrics["val_loss"], "status": "ok",
                        "trial": trial.to_params()})
    assert keep_models(logger, results, folder, "all") == 2
    client = MlflowClient(spec.placement.tracking_uri)
    runs = client.search_runs([experiment_id], "tags.`loopscale.kind` = 'trial'")
    return spec, client, {int(run.data.params["r"]): run.info.run_id for run in runs}


def replace_file(client, run_id: str, data: bytes, tmp_path) -> None:
    """Overwrite a run's artifact model.pt, as anyone with write access to the artifact store can."""
    folder = tmp_path / f"upload-{run_id}"
    folder.mkdir()
    (folder / "model.pt").write_bytes(data)
    client.log_artifact(run_id, str(folder / "model.pt"))


def forged(data: bytes, **template) -> bytes:
    """A model file whose trial config's template is changed by ``template``."""
    kept = torch.load(io.BytesIO(data), weights_only=True)
    kept["trial"]["template"].update(template)
    buffer = io.BytesIO()
    torch.save(kept, buffer)
    return buffer.getvalue()


def evaluate(spec, capsys, *recurrences: str) -> tuple[int, str, list[str]]:
    from loopscale.search.cli import main

    capsys.readouterr()
    code = main(["evaluate", spec.name, "--r", *recurrences, "--tracking-uri", spec.placement.tracking_uri])
    out, err = capsys.readouterr()
    return code, out, err.strip().splitlines()


def test_a_forged_model_file_naming_other_code_is_refused_and_nothing_is_imported(tmp_path, files, capsys):
    from loopscale import load_model
    from loopscale.search.models import ForeignModel
    from loopscale.search.tracking import KEPT_DIGEST_TAG

    spec, client, run_ids = kept_store(tmp_path, files)
    mark = tmp_path / "mark"
    (tmp_path / "artifacts" / "planted.py").write_text(MARKER.format(mark=str(mark)))  # beside the run's artifacts
    bad = forged(files[2][2], architecture=f"{tmp_path}/artifacts/planted.py:build")
    replace_file(client, run_ids[2], bad, tmp_path)
    where = f"run {run_ids[2]}'s model.pt was not trained as its run: the file names architecture "
    code, out, err = evaluate(spec, capsys, "1,2")
    assert code == 2 and len(err) == 1 and where in err[0] and "the run 'loopscale:looped'" in err[0], err
    assert not mark.exists() and out == ""
    assert not any({"val_loss_r1", "val_loss_r2"} & set(trial_numbers(client.get_run(run_id)))
                   for run_id in run_ids.values())  # nothing logged, for either run
    with pytest.raises(ForeignModel, match="^" + where):
        load_model(run_ids[2], spec.placement.tracking_uri)
    # the digest tag rewritten to the forged file's: the run's params still name the code it may build
    client.set_tag(run_ids[2], KEPT_DIGEST_TAG, hashlib.sha256(bad).hexdigest())
    with pytest.raises(ForeignModel, match="^" + where):
        load_model(run_ids[2], spec.placement.tracking_uri)
    assert not mark.exists()


def test_a_file_whose_weights_are_not_the_kept_ones_is_refused_by_its_digest(tmp_path, files):
    from loopscale import load_model
    from loopscale.search.models import ForeignModel

    spec, client, run_ids = kept_store(tmp_path, files)
    kept = torch.load(io.BytesIO(files[2][2]), weights_only=True)
    kept["model"] = {name: torch.zeros_like(tensor) for name, tensor in kept["model"].items()}
    buffer = io.BytesIO()
    torch.save(kept, buffer)
    replace_file(client, run_ids[2], buffer.getvalue(), tmp_path)
    with pytest.raises(ForeignModel, match=f"^run {run_ids[2]}'s model.pt is not the file kept for the run: its "
                                           "sha256 is [0-9a-f]{16}..., the run recorded [0-9a-f]{16}"):
        load_model(run_ids[2], spec.placement.tracking_uri)


def test_two_runs_files_exchanged_are_refused_for_both(tmp_path, files, capsys):
    from loopscale import load_model
    from loopscale.search.models import ForeignModel

    spec, client, run_ids = kept_store(tmp_path, files)
    replace_file(client, run_ids[1], files[2][2], tmp_path)
    replace_file(client, run_ids[2], files[1][2], tmp_path)
    for r, other in ((1, 2), (2, 1)):
        with pytest.raises(ForeignModel, match=f"^run {run_ids[r]}'s model.pt was not trained as its run: the "
                                               f"file's r is '{other}', the run's '{r}'; nothing was built"):
            load_model(run_ids[r], spec.placement.tracking_uri)
    code, out, err = evaluate(spec, capsys, "1,2")
    assert code == 2 and len(err) == 1 and out == "", err
    assert all(run_id in err[0] for run_id in run_ids.values())
    assert not any("val_loss_r1" in trial_numbers(client.get_run(run_id)) for run_id in run_ids.values())


def test_evaluate_skips_a_truncated_file_in_one_line_and_evaluates_the_rest(tmp_path, files, capsys):
    spec, client, run_ids = kept_store(tmp_path, files)
    replace_file(client, run_ids[2], files[2][2][:20_000], tmp_path)
    code, out, err = evaluate(spec, capsys, "1")
    skipped = [line for line in err if "skipped" in line]
    assert code == 0 and len(skipped) == 1, err
    assert f"r=2 d=32: skipped: run {run_ids[2]}'s model.pt is not a loopscale model file" in skipped[0]
    assert "val_loss_r1" in out and len(out.strip().splitlines()) == 3  # the header and both runs
    assert trial_numbers(client.get_run(run_ids[1]))["val_loss_r1"] == pytest.approx(files[1][1]["val_loss"],
                                                                                     abs=1e-6)
    assert "val_loss_r1" not in trial_numbers(client.get_run(run_ids[2]))


def test_evaluate_skips_a_run_whose_file_is_gone_in_one_line(tmp_path, files, capsys):
    from urllib.parse import urlparse

    spec, client, run_ids = kept_store(tmp_path, files)
    (Path(urlparse(client.get_run(run_ids[1]).info.artifact_uri).path) / "model.pt").unlink()
    code, out, err = evaluate(spec, capsys, "2")
    assert code == 0 and [line for line in err if "skipped" in line] == [
        f"loopscale: search C=4e+09 r=1 d=32: skipped: run {run_ids[1]} is tagged loopscale.model but holds no "
        "artifact model.pt"], err
    assert "val_loss_r2" in trial_numbers(client.get_run(run_ids[2]))


@pytest.mark.parametrize("recurrences", ["99999999999999999999", "1e20", f"2,{MAX_EVAL_R + 1}"])
def test_evaluate_refuses_a_recurrence_count_beyond_its_bound_in_one_line(tmp_path, files, capsys, recurrences):
    spec, client, run_ids = kept_store(tmp_path, files)
    code, out, err = evaluate(spec, capsys, recurrences)
    assert code == 2 and len(err) == 1 and out == "", err
    assert f"--r must list distinct whole recurrence counts from 1 to {MAX_EVAL_R:,}" in err[0]


def test_load_model_takes_a_whole_r_or_none_for_the_trained_one(tmp_path, files):
    from loopscale import load_model

    spec, client, run_ids = kept_store(tmp_path, files)
    uri = spec.placement.tracking_uri
    trained = load_model(run_ids[2], uri, r=None)
    assert trained.r == 2 and trained.validation_loss() == pytest.approx(files[2][1]["val_loss"], abs=1e-6)
    deeper = load_model(run_ids[2], uri, r=4)
    assert deeper.r == 4 and deeper.module.config.r == 4
    passes, block_runs = [], []
    deeper.module.prelude[0].register_forward_hook(lambda *_: passes.append(1))
    deeper.module.core[0].register_forward_hook(lambda *_: block_runs.append(1))
    assert deeper.validation_loss() == pytest.approx(trained.validation_loss(r=4), abs=1e-6)
    assert len(passes) >= 1 and len(block_runs) == 4 * len(passes)  # its module runs the block 4 times
    assert deeper.validation_loss(r=2) == pytest.approx(trained.validation_loss(), abs=1e-6)
    for r in (2.5, "2", True, 0, 10**20):
        message = f"^r must be a whole number of recurrences from 1 to {MAX_EVAL_R:,}, got {r!r}$"
        with pytest.raises(ValueError, match=message):
            load_model(run_ids[2], uri, r=r)
        with pytest.raises(ValueError, match=message):
            trained.at(r)
        with pytest.raises(ValueError, match=message):
            trained.validation_loss(r=r)


SHARED = """
import torch
import torch.nn.functional as F


class Shared(torch.nn.Module):
    '''One shared layer applied config.r times after a linear injection of the embedding: its weights are the same
    at every r, r = 1 included.'''

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed = torch.nn.Embedding(config.vocab_size, config.width)
        self.inject = torch.nn.Linear(2 * config.width, config.width)
        self.layer = torch.nn.Linear(config.width, config.width)
        self.head = torch.nn.Linear(config.width, config.vocab_size)

    def forward(self, idx, targets=None):
        e = self.embed(idx)
        h = torch.zeros_like(e)
        for _ in range(self.config.r):
            h = torch.tanh(self.layer(self.inject(torch.cat([e, h], -1))))
        logits = self.head(h)
        return logits if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())


asked = []


def build(config):
    asked.append((config.r, config.injection))
    return Shared(config)
"""


def test_an_own_looped_architecture_with_linear_injection_is_asked_at_r_1(tmp_path):
    from loopscale.model.architecture import build, factory

    (tmp_path / "shared_loop.py").write_text(SHARED)
    template = {**TEMPLATE, "architecture": f"{tmp_path}/shared_loop.py:build"}
    trial = TrialConfig(budget_flops=4e9, s=2.0, r=2, template=template, batch_tokens=512, data={"source": "kjv"},
                        cache_dir=str(tmp_path), val_tokens=2048, num_threads=1)
    assert trial.model_config.injection == "linear"
    weights = build(trial.model_config).state_dict()
    once = rebuild(trial, weights, r=1)
    assert factory(template["architecture"]).__globals__["asked"][-1] == (1, "none")  # r = 1's config: no injection
    with torch.no_grad():
        loss = once(torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long))
    assert math.isfinite(float(loss))
