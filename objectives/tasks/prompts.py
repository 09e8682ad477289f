"""An item's prompts with its few-shot examples, as the paper's evaluation code renders them (the DCLM CORE
convention, as nanochat's ``core_eval`` implements it).

Few-shot examples: ``num_fewshot`` other items of the same task, drawn by ``random.Random(1234 + i).sample`` from
the items other than item i (so an item's examples are fixed and never the item itself). Each example is written
solved, followed by a blank line, then the item:

    multiple_choice    query + delimiter + choice          one prompt per choice; examples show choices[gold]
    schema             context_option + delimiter + continuation   one prompt per context option
    language_modeling  context.strip() + delimiter + continuation, and the same without the continuation (with
                       its trailing whitespace stripped): the scorer predicts the tokens in between
"""

from __future__ import annotations

import random
from typing import Any

from .bundle import Task

FEWSHOT_SEED = 1234


def fewshot_examples(task: Task, index: int) -> list[dict[str, Any]]:
    """The examples shown before item ``index`` (module docstring)."""
    if task.num_fewshot == 0:
        return []
    others = [i for i in range(len(task.items)) if i != index]
    return [task.items[i] for i in random.Random(FEWSHOT_SEED + index).sample(others, task.num_fewshot)]


def render(task: Task, index: int) -> list[str]:
    """The prompts of item ``index``: one per option (multiple_choice, schema), or [without, with] the
    continuation (language_modeling)."""
    item, d = task.items[index], task.continuation_delimiter
    shots = fewshot_examples(task, index)
    if task.task_type == "multiple_choice":
        head = "".join(f"{ex['query']}{d}{ex['choices'][ex['gold']]}\n\n" for ex in shots)
        return [f"{head}{item['query']}{d}{choice}" for choice in item["choices"]]
    if task.task_type == "schema":
        head = "".join(f"{ex['context_options'][ex['gold']]}{d}{ex['continuation']}\n\n" for ex in shots)
        return [f"{head}{option}{d}{item['continuation']}" for option in item["context_options"]]
    head = "".join(f"{ex['context'].strip()}{d}{ex['continuation']}\n\n" for ex in shots)
    prompt = f"{head}{item['context'].strip()}{d}"
    return [prompt.strip(), prompt + item["continuation"]]


def solved(task: Task, item: dict[str, Any]) -> str:
    """``item`` written solved, as a few-shot example shows it: the text a training document holds."""
    d = task.continuation_delimiter
    if task.task_type == "multiple_choice":
        return f"{item['query']}{d}{item['choices'][item['gold']]}"
    if task.task_type == "schema":
        return f"{item['context_options'][item['gold']]}{d}{item['continuation']}"
    return f"{item['context'].strip()}{d}{item['continuation']}"
