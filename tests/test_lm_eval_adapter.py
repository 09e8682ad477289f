"""The lm-evaluation-harness adapter (search/harness/lm_eval_model.py), where ``lm-eval`` is installed (an
optional extra; skipped otherwise): a real trained model, kept, runs a local JSONL multiple-choice task through the
harness' ``simple_evaluate``, offline, and its accuracy, log-likelihoods, rolling log-likelihood and greedy
generation equal the same computed straight from the module."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

lm_eval = pytest.importorskip("lm_eval")

ITEMS = [{"query": "In the beginning God created the", "choices": ["heaven", "zebra", "qqq"], "gold": 0},
         {"query": "And the LORD said unto", "choices": ["Moses", "xylophone"], "gold": 0},
         {"query": "And it came to", "choices": ["pass", "kkkk", "toaster"], "gold": 0},
         {"query": "The earth was without", "choices": ["form", "wifi"], "gold": 1}]


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    from loopscale.objectives import TrialConfig, train
    from loopscale.objectives.kept import read_file, rebuild
    from loopscale.search.models import KeptModel

    cache = str(tmp_path_factory.mktemp("lm-eval-cache"))
    template = dict(depth=6, prelude=1, coda=1, width_unit=16, head_dim=16, seq_len=64, vocab_size=256,
                    injection="linear")
    trial = TrialConfig(budget_flops=4e9, s=2.0, r=2, template=template, batch_tokens=512, data={"source": "kjv"},
                        cache_dir=cache, val_tokens=2048, num_threads=1, recipe={"log_every": 2})
    files: list[bytes] = []
    train(trial, keep=files.append)
    params, weights = read_file(files[0], "the trained file")  # this test's own file: trusted, nothing to check
    trial = TrialConfig.from_params(params)
    return KeptModel(module=rebuild(trial, weights), trial=trial, run_id="local", weights=weights, r=trial.r)


def direct_logprob(module, context: str, continuation: str) -> tuple[float, bool]:
    ids = [0, *context.encode(), *continuation.encode()]
    n = len(continuation.encode())
    with torch.no_grad():
        logp = F.log_softmax(module(torch.tensor([ids[:-1]])).float(), -1)[0]
    targets = torch.tensor(ids[-n:])
    return float(logp[-n:].gather(1, targets[:, None]).sum()), bool((logp[-n:].argmax(-1) == targets).all())


def test_a_kept_model_runs_a_local_jsonl_task_through_the_harness(kept, tmp_path, monkeypatch):
    from lm_eval.api.instance import Instance
    from lm_eval.tasks import TaskManager

    from loopscale.search.harness.lm_eval_model import LoopscaleLM

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in ITEMS))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "local.yaml").write_text(
        f"task: loopscale_local_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: query\ndoc_to_choice: choices\n"
        "doc_to_target: gold\nmetric_list:\n  - metric: acc\n")
    model = LoopscaleLM(kept=kept, r=4)
    results = lm_eval.simple_evaluate(model=model, tasks=["loopscale_local_mc"],
                                      task_manager=TaskManager(include_path=str(tmp_path / "tasks")),
                                      log_samples=False, bootstrap_iters=0)
    module = kept.at(4)
    right = [max(range(len(it["choices"])), key=lambda c: direct_logprob(module, it["query"], " " + it["choices"][c])
                 [0]) == it["gold"] for it in ITEMS]
    assert results["results"]["loopscale_local_mc"]["acc,none"] == pytest.approx(sum(right) / len(ITEMS))

    request = Instance("loglikelihood", {}, ("And God said,", " Let there be light"), 0)
    [(logprob, greedy)] = model.loglikelihood([request])
    assert (logprob, greedy) == pytest.approx(direct_logprob(module, "And God said,", " Let there be light"), rel=1e-5)
    text = "And God saw the light, that it was good"
    [rolling] = model.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    assert rolling == pytest.approx(direct_logprob(module, "", text)[0], rel=1e-5)  # shorter than one window
    [generated] = model.generate_until([Instance("generate_until", {}, ("And God", {"until": ["\n"],
                                                                                   "max_gen_toks": 12}), 0)])
    ids = [0, *b"And God"]
    with torch.no_grad():
        for _ in range(12):
            ids.append(int(module(torch.tensor([ids]))[0, -1].argmax()))
    assert generated == bytes(ids[8:]).decode("utf-8", "replace").split("\n")[0]
    with pytest.raises(ValueError, match="needs model_args run=RUN_ID"):
        LoopscaleLM()
