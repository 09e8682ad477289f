"""Downstream tasks: a DCLM / CORE-style bundle read unchanged (the paper's and DCLM's spellings), one line for
each bad bundle and for a hub dataset; the scoring of each task type, few-shot included, equal to a hand
computation on a bigram model whose logits are a table; the built-in probes the same for the same seed."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from loopscale.objectives.tasks.bundle import load_bundle
from loopscale.objectives.tasks.probes import AXES, probe_documents, probe_tasks
from loopscale.objectives.tasks.prompts import solved
from loopscale.objectives.tasks.scoring import centered, continuation_scores, score_task, sequences

MC = [{"query": "Sky is", "choices": ["blue", "green", "red"], "gold": 0},
      {"query": "Grass is", "choices": ["green", "blue"], "gold": 0},
      {"query": "Snow is", "choices": ["white", "black"], "gold": 1}]
SCHEMA = [{"context_options": ["Tom ran", "Ann sat"], "continuation": "fast", "gold": 0},
          {"context_options": ["Bo ate", "Al hid"], "continuation": "well", "gold": 1},
          {"context_options": ["We sang", "It fell"], "continuation": "loud", "gold": 0}]
LM = [{"context": "one two ", "continuation": "three"}, {"context": "a b", "continuation": "c"},
      {"context": "x y", "continuation": "zz"}]
PAPER_YAML = """tasks:
  - label: sky
    dataset_uri: world/sky.jsonl
    task_type: multiple_choice
    num_fewshot: 1
    continuation_delimiter: " "
    group: parametric_knowledge
  - label: wino
    dataset_uri: language/wino.jsonl
    task_type: schema
    num_fewshot: 1
    continuation_delimiter: " "
  - label: count
    dataset_uri: language/count.jsonl
    task_type: language_modeling
    num_fewshot: 1
    continuation_delimiter: " => "
"""


def write_bundle(root, yaml_text=PAPER_YAML, name="bundle.yaml"):
    for folder, file, items in (("world", "sky", MC), ("language", "wino", SCHEMA), ("language", "count", LM)):
        (root / "eval_data" / folder).mkdir(parents=True, exist_ok=True)
        (root / "eval_data" / folder / f"{file}.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    (root / name).write_text(yaml_text)
    return root / name


def test_a_bundle_in_the_papers_format_loads_unchanged(tmp_path):
    mc, schema, lm = load_bundle(write_bundle(tmp_path))
    assert (mc.label, mc.task_type, mc.axis, mc.num_fewshot, mc.items) == ("sky", "multiple_choice",
                                                                            "parametric_knowledge", 1, tuple(MC))
    assert mc.baseline == pytest.approx((1 / 3 + 1 / 2 + 1 / 2) / 3)  # the chance of guessing, item by item
    assert (schema.axis, schema.baseline, schema.items) == ("language", 0.5, tuple(SCHEMA))  # axis: the folder
    assert (lm.continuation_delimiter, lm.baseline, lm.items) == (" => ", 0.0, tuple(LM))


def test_a_bundle_in_dclm_and_nanochats_spelling_loads_with_its_meta_baselines(tmp_path):
    yaml_text = ("icl_tasks:\n- label: sky\n  dataset_uri: world/sky.jsonl\n  num_fewshot: [0, 1]\n"
                 "  icl_task_type: multiple_choice\n")
    path = write_bundle(tmp_path, yaml_text, "core.yaml")
    (tmp_path / "eval_meta_data.csv").write_text("Eval Task,Task Category,Random baseline\nsky,world,25.0\n")
    zero, one = load_bundle(path)
    assert (zero.label, zero.num_fewshot, one.label, one.num_fewshot) == ("sky_0shot", 0, "sky_1shot", 1)
    assert zero.baseline == one.baseline == 0.25 and zero.axis == "world"


@pytest.mark.parametrize("yaml_text, message", [
    ("tasks:\n- label: t\n  hf_repo: allenai/ai2_arc\n  task_type: multiple_choice\n",
     r"task 't' is a Hugging Face hub dataset \(allenai/ai2_arc\); evaluation reads local files only"),
    ("tasks:\n- label: t\n  dataset_uri: hf://datasets/x/y\n  task_type: schema\n", "is a Hugging Face hub dataset"),
    ("tasks:\n- label: t\n  dataset_uri: world/sky.jsonl\n  task_type: cloze\n", "task_type must be one of"),
    ("tasks:\n- label: t\n  dataset_uri: world/sky.jsonl\n  task_type: schema\n",
     r"sky.jsonl line 1: a schema item needs context_options, continuation, gold; 'context_options' is missing"),
    ("tasks:\n- label: t\n  dataset_uri: world/none.jsonl\n  task_type: schema\n", "no such file"),
    ("tasks:\n- label: t\n  dataset_uri: world/sky.jsonl\n  task_type: multiple_choice\n  num_fewshot: 3\n",
     "num_fewshot 3 needs more than 3 items"),
    ("tasks:\n- label: t\n  datset_uri: world/sky.jsonl\n",
     r"unknown key 'datset_uri' \(did you mean 'dataset_uri'\?\)"),
    ("tasks: []\n", "lists its tasks under 'tasks:'"),
])
def test_a_bad_bundle_is_one_line_naming_the_task(tmp_path, yaml_text, message):
    with pytest.raises(ValueError, match=message) as caught:
        load_bundle(write_bundle(tmp_path, yaml_text))
    assert "\n" not in str(caught.value)


class Bigram(torch.nn.Module):
    """A language model whose logits at position t are row x_t of a table: p(x_{t+1} | x_<=t) = softmax(W[x_t])."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = table

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.table[idx]


@pytest.fixture(scope="module")
def table():
    torch.manual_seed(0)
    table = torch.randn(256, 256, dtype=torch.float64)
    for a, b in ("> ", " t", "th", "hr", "re", "ee", "zz"):  # make some greedy continuations right
        table[ord(a), ord(b)] += 8
    return table


def encode(text: str) -> list[int]:
    return list(text.encode())


def hand_ce(table, text: str, continuation_bytes: int) -> float:
    """Mean -log softmax(W[prev])[next] over the last ``continuation_bytes`` bytes of NUL + text, by hand."""
    ids = [0, *text.encode()]
    terms = []
    for t in range(len(ids) - continuation_bytes, len(ids)):
        row = [float(v) for v in table[ids[t - 1]]]
        terms.append(math.log(sum(math.exp(v) for v in row)) - row[ids[t]])
    return sum(terms) / len(terms)


def hand_greedy(table, text: str, continuation_bytes: int) -> bool:
    ids = [0, *text.encode()]
    return all(max(range(256), key=lambda v: float(table[ids[t - 1], v])) == ids[t]
               for t in range(len(ids) - continuation_bytes, len(ids)))


def shot(i: int) -> int:
    """The few-shot example of item i of three: random.Random(1234 + i).sample of the other two, as CORE draws."""
    return random.Random(1234 + i).sample([j for j in range(3) if j != i], 1)[0]


def test_scoring_equals_a_hand_computation_for_each_task_type_with_few_shot(tmp_path, table):
    mc, schema, lm = load_bundle(write_bundle(tmp_path))
    model = Bigram(table)
    # multiple choice: "<example query> <its gold>\n\n<query> <choice>"; the choice's bytes are the continuation
    expected = []
    for i, item in enumerate(MC):
        ex = MC[shot(i)]
        head = f"{ex['query']} {ex['choices'][ex['gold']]}\n\n{item['query']} "
        ces = [hand_ce(table, head + c, len(c)) for c in item["choices"]]
        expected.append(ces.index(min(ces)) == item["gold"])
        losses, _ = continuation_scores(model, [s for s in sequences(mc, encode, 0, 512) if s.item == i])
        assert losses == pytest.approx(ces, rel=1e-6)
    assert score_task(model, mc, encode, 0, 512) == expected
    # schema: "<example's gold context> <continuation>\n\n<option> <continuation>"; the continuation is scored
    expected = []
    for i, item in enumerate(SCHEMA):
        ex = SCHEMA[shot(i)]
        head = f"{ex['context_options'][ex['gold']]} {ex['continuation']}\n\n"
        ces = [hand_ce(table, f"{head}{o} {item['continuation']}", len(item["continuation"]) + 1)
               for o in item["context_options"]]
        expected.append(ces.index(min(ces)) == item["gold"])
        losses, _ = continuation_scores(model, [s for s in sequences(schema, encode, 0, 512) if s.item == i])
        assert losses == pytest.approx(ces, rel=1e-6)
    assert score_task(model, schema, encode, 0, 512) == expected
    # language modeling: "<example context, stripped> => <its continuation>\n\n<context> =>" then greedy bytes
    expected = []
    for i, item in enumerate(LM):
        head = f"{LM[shot(i)]['context'].strip()} => {LM[shot(i)]['continuation']}\n\n"
        expected.append(hand_greedy(table, f"{head}{item['context'].strip()} => {item['continuation']}",
                                    len(item["continuation"]) + 1))
    assert score_task(model, lm, encode, 0, 512) == expected
    assert expected == [True, False, False]  # the table makes " three" greedy; row " " prefers t to c and z
    assert centered(0.75, 0.5) == 0.5 and centered(0.5, 0.5) == 0.0


def test_a_long_prompt_keeps_its_last_tokens(tmp_path, table):
    mc = load_bundle(write_bundle(tmp_path))[0]
    cropped = sequences(mc, encode, 0, 8)
    assert all(len(s.tokens) <= 8 and s.end == len(s.tokens) for s in cropped)
    full = sequences(mc, encode, 0, 512)
    assert [s.tokens[-(s.end - s.start):] for s in full] == [s.tokens[s.start:] for s in cropped]


def test_the_probes_are_the_same_for_the_same_seed_and_cover_the_five_axes():
    first, again, other = probe_tasks(0), probe_tasks(0), probe_tasks(1)
    assert [t.items for t in first] == [t.items for t in again]
    assert all(a.items != b.items for a, b in zip(first, other))
    assert {t.axis for t in first} == set(AXES)
    for task in first:
        assert len({solved(task, item) for item in task.items}) == len(task.items) >= 100
        if task.task_type == "multiple_choice":
            golds = [item["gold"] for item in task.items]
            assert len(set(golds)) > 1  # the answer's position varies
    import itertools
    docs = list(itertools.islice(probe_documents(0), 40))
    assert docs == list(itertools.islice(probe_documents(0), 40))
    text = "\n\n".join(docs)
    for task in first:
        held = [solved(task, item) for item in task.items]
        if task.axis == "parametric_knowledge":
            assert sum(h + "." in text for h in held) > 10  # training holds the facts the closed-book probes ask
        else:
            assert not any(h in text.split("\n\n") for h in held)  # and no other probe's own instance


def test_a_data_spec_mixes_the_probes_documents_into_the_stream_and_plain_specs_keep_their_fingerprint(tmp_path):
    from loopscale.objectives.data.cache import data_fingerprint, open_packed, prepare_data
    from loopscale.objectives.data.spec import normalize_data

    plain = {"source": "kjv", "max_tokens": 60_000}
    mixed = {**plain, "probe_share": 0.5}
    assert "probe_share" not in normalize_data(plain) and normalize_data(mixed)["probe_seed"] == 0
    assert data_fingerprint(mixed, 64, 256) != data_fingerprint(plain, 64, 256)
    assert data_fingerprint(mixed, 64, 256) != data_fingerprint({**mixed, "probe_seed": 1}, 64, 256)
    packed = open_packed(str(tmp_path), prepare_data(mixed, 64, str(tmp_path), 256))
    text = bytes(packed.train.reshape(-1).astype("uint8")).decode("utf-8", "replace")
    facts = [f"{solved(t, i)}." for t in probe_tasks(0) if t.axis == "parametric_knowledge" for i in t.items]
    assert sum(fact in text for fact in facts) > 20 and "LORD" in text
    for bad, message in (({"probe_share": 1.0}, r"data.probe_share must be a share of the documents in \(0, 1\)"),
                         ({"probe_seed": 3}, "data.probe_seed applies only with probe_share"),
                         ({"source": "synthetic", "probe_share": 0.1}, "the synthetic source generates token ids")):
        with pytest.raises(ValueError, match=message):
            normalize_data(bad)
