"""The built-in probes: tasks on the paper's five axes, generated from a seed, and the documents that teach them.

``probe_tasks(seed)`` gives the same tasks for the same seed, on any machine (``random.Random`` seeded by a
string), without a download. Each holds ``ITEMS`` items (the knowledge tasks one per person of the world), so a
task's accuracy has a 95% interval of about +-6 points (+-9 for the knowledge tasks), and is short enough for a
byte-level model's context of 128:

    axis                     task                 type               what an item asks (chance)
    parametric_knowledge     knowledge_city       multiple_choice    "<person> lives in" -> their city (1/4)
                             knowledge_trade      multiple_choice    "<person> works as a" -> their trade (1/4)
    reading_comprehension    context_city         multiple_choice    three people's cities given, one asked (1/4)
    math_word_problems       word_arithmetic      language_modeling  "Ana has 3 pears. She gets 4 more. ..." -> 7
    reasoning_primitives     variables_math_d0    multiple_choice    5 variables = distinct 1-25, one asked (1/5)
                             variables_math_d1    multiple_choice    + 5 aliases, each of a distinct variable (1/5)
                             variables_code_d0    multiple_choice    the same as assignments and print(x) (1/5)
                             variables_code_d1    multiple_choice    (1/5)
                             induction            multiple_choice    8 pairs of random 3-letter strings (1/8)
    compositional_symbolic   brackets             multiple_choice    the closers of 4 open brackets (1/4)

The facts the knowledge tasks ask about belong to a world drawn from the seed (``WORLD_PEOPLE`` invented people,
each with a city and a trade): closed-book, a model knows them only when its training data held them.
``probe_documents(seed)`` is that training data: an endless stream of documents, each ``DOC_INSTANCES`` solved
instances of one task (in turn) joined by blank lines, as few-shot examples are: the world's facts, and for
every other task fresh instances drawn from another stream than the probes' own, any instance a probe holds
left out, so a model that learns them has learnt the task, not its test items. A data spec mixes them into the
training stream with ``probe_share`` (objectives/data/spec.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .bundle import Task, chance
from .prompts import solved

BUILT_IN = "probes"
ITEMS = 200
WORLD_PEOPLE = 100
DOC_INSTANCES = 8
AXES = ("parametric_knowledge", "reading_comprehension", "math_word_problems", "reasoning_primitives",
        "compositional_symbolic")
_SYLLABLES = ("ba", "do", "fe", "ga", "hi", "ko", "lu", "ma", "ne", "po", "ra", "si", "ta", "vo", "ze", "mi", "ro",
              "ka", "li", "su")
_TRADES = ("baker", "smith", "weaver", "potter", "miller", "tailor", "mason", "fisher", "carter", "cooper",
           "tanner", "farmer")
_FIRST_NAMES = ("Ana", "Ben", "Cara", "Dan", "Eva", "Finn", "Gus", "Hana", "Ivo", "Jude", "Kai", "Lena")
_THINGS = ("apples", "pears", "coins", "books", "shells", "stones", "cards", "eggs")
_OPEN, _CLOSE = "([{<", ")]}>"
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class World:
    """The seed's invented people, each with a city and a trade, and the cities people live in."""

    people: tuple[str, ...]
    cities: tuple[str, ...]
    city: dict[str, str]
    trade: dict[str, str]


@lru_cache(maxsize=8)
def world(seed: int) -> World:
    rng = random.Random(f"loopscale-probes/{seed}/world")
    cities = _distinct(rng, 12, lambda: _word(rng, 3).capitalize())
    people = _distinct(rng, WORLD_PEOPLE, lambda: _person(rng), exclude=set(cities))
    return World(people=tuple(people), cities=tuple(cities), city={p: rng.choice(cities) for p in people},
                 trade={p: rng.choice(_TRADES) for p in people})


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(syllables))


def _person(rng: random.Random) -> str:
    return f"{_word(rng, 2).capitalize()} {_word(rng, 2).capitalize()}"


def _distinct(rng: random.Random, n: int, draw: Callable[[], Any], exclude: set | None = None) -> list:
    seen, out = set(exclude or ()), []
    while len(out) < n:
        value = draw()
        if value not in seen:
            seen.add(value)
            out.append(value)
    return out


def _choices(rng: random.Random, gold: str, pool: list[str] | tuple[str, ...], n: int) -> tuple[list[str], int]:
    """``gold`` with n - 1 other options of ``pool``, shuffled; the gold's index."""
    options = [gold, *rng.sample([o for o in pool if o != gold], n - 1)]
    rng.shuffle(options)
    return options, options.index(gold)


def _knowledge(relation: str) -> Callable[[random.Random, World, int], dict]:
    def make(rng: random.Random, w: World, i: int) -> dict:
        person = w.people[i % len(w.people)]
        if relation == "city":
            choices, gold = _choices(rng, w.city[person], w.cities, 4)
            return {"query": f"{person} lives in", "choices": choices, "gold": gold}
        choices, gold = _choices(rng, w.trade[person], _TRADES, 4)
        return {"query": f"{person} works as a", "choices": choices, "gold": gold}
    return make


def _context_city(rng: random.Random, w: World, i: int) -> dict:
    people = _distinct(rng, 3, lambda: _person(rng), exclude=set(w.people))
    cities = rng.sample(w.cities, 3)
    asked = rng.randrange(3)
    told = " ".join(f"{p} lives in {c}." for p, c in zip(people, cities))
    choices, gold = _choices(rng, cities[asked], [*cities, rng.choice([c for c in w.cities if c not in cities])], 4)
    return {"query": f"{told} {people[asked]} lives in", "choices": choices, "gold": gold}


def _word_arithmetic(rng: random.Random, w: World, i: int) -> dict:
    name, things = rng.choice(_FIRST_NAMES), rng.choice(_THINGS)
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    if rng.random() < 0.5:
        story, answer = f"{name} has {a} {things}. {name} gets {b} more.", a + b
    else:
        a, b = max(a, b) + 1, min(a, b)
        story, answer = f"{name} has {a} {things}. {name} gives away {b}.", a - b
    return {"context": f"{story} How many {things} does {name} have now?", "continuation": str(answer)}


def _variables(code: bool, depth: int) -> Callable[[random.Random, World, int], dict]:
    def make(rng: random.Random, w: World, i: int) -> dict:
        names = rng.sample(_LETTERS, 10 if depth else 5)
        values = rng.sample(range(1, 26), 5)
        lines = [f"{n} = {v}" for n, v in zip(names, values)]
        targets = list(range(5))
        if depth:
            rng.shuffle(targets)  # alias k points at base targets[k]: each a distinct base
            lines += [f"{names[5 + k]} = {names[targets[k]]}" for k in range(5)]
        asked = rng.randrange(5)
        name, gold = (names[5 + asked], targets[asked]) if depth else (names[asked], asked)
        query = "\n".join(lines) + f"\nprint({name})" if code else f"Let {', '.join(lines)}. Then {name} ="
        return {"query": query, "choices": [str(v) for v in values], "gold": gold}
    return make


def _induction(rng: random.Random, w: World, i: int) -> dict:
    strings = _distinct(rng, 16, lambda: "".join(rng.choice(_LETTERS) for _ in range(3)))
    keys, values = strings[:8], strings[8:]
    asked = rng.randrange(8)
    pairs = "\n".join(f"{k} {v}" for k, v in zip(keys, values))
    return {"query": f"{pairs}\n{keys[asked]}", "choices": values, "gold": asked}


def _brackets(rng: random.Random, w: World, i: int) -> dict:
    opened = [rng.randrange(4) for _ in range(4)]
    gold = "".join(_CLOSE[k] for k in reversed(opened))
    others = _distinct(rng, 3, lambda: "".join(rng.choice(_CLOSE) for _ in range(4)), exclude={gold})
    choices, index = _choices(rng, gold, others, 4)
    return {"query": "close " + "".join(_OPEN[k] for k in opened), "choices": choices, "gold": index}


@dataclass(frozen=True)
class Probe:
    """One built-in task: its label, axis, type, delimiter and the generator of its i-th item."""

    label: str
    axis: str
    task_type: str
    make: Callable[[random.Random, World, int], dict]
    delimiter: str = " "

    @property
    def knowledge(self) -> bool:
        return self.axis == "parametric_knowledge"


PROBES = (
    Probe("knowledge_city", "parametric_knowledge", "multiple_choice", _knowledge("city")),
    Probe("knowledge_trade", "parametric_knowledge", "multiple_choice", _knowledge("trade")),
    Probe("context_city", "reading_comprehension", "multiple_choice", _context_city),
    Probe("word_arithmetic", "math_word_problems", "language_modeling", _word_arithmetic, " Answer: "),
    Probe("variables_math_d0", "reasoning_primitives", "multiple_choice", _variables(False, 0)),
    Probe("variables_math_d1", "reasoning_primitives", "multiple_choice", _variables(False, 1)),
    Probe("variables_code_d0", "reasoning_primitives", "multiple_choice", _variables(True, 0), "\n"),
    Probe("variables_code_d1", "reasoning_primitives", "multiple_choice", _variables(True, 1), "\n"),
    Probe("induction", "reasoning_primitives", "multiple_choice", _induction),
    Probe("brackets", "compositional_symbolic", "multiple_choice", _brackets),
)


def _task(probe: Probe, items: tuple[dict, ...]) -> Task:
    return Task(label=probe.label, task_type=probe.task_type, items=items, axis=probe.axis,
                baseline=chance(probe.task_type, items), continuation_delimiter=probe.delimiter)


def probe_tasks(seed: int = 0) -> list[Task]:
    """The built-in probes of ``seed`` (module docstring): ``ITEMS`` distinct items each (the knowledge tasks one
    per person of the world)."""
    w = world(seed)
    tasks = []
    for probe in PROBES:
        rng = random.Random(f"loopscale-probes/{seed}/eval/{probe.label}")
        count = len(w.people) if probe.knowledge else ITEMS
        items: dict[str, dict] = {}
        i = 0
        while len(items) < count:
            item = probe.make(rng, w, i)
            items.setdefault(solved(_task(probe, (item,)), item), item)
            i += 1
        tasks.append(_task(probe, tuple(items.values())))
    return tasks


def probe_documents(seed: int = 0) -> Iterator[str]:
    """Training documents of the probes of ``seed``, endlessly (module docstring)."""
    w = world(seed)
    held = {t.label: {solved(t, item) for item in t.items} for t in probe_tasks(seed)}
    for j in _count():
        probe = PROBES[j % len(PROBES)]
        rng = random.Random(f"loopscale-probes/{seed}/train/{j}")
        instances: list[str] = []
        while len(instances) < DOC_INSTANCES:
            item = probe.make(rng, w, rng.randrange(len(w.people)))
            text = solved(_task(probe, (item,)), item)
            if probe.knowledge or text not in held[probe.label]:
                instances.append(text + "." if probe.knowledge else text)
        yield "\n\n".join(instances) + "\n"


def _count() -> Iterator[int]:
    j = 0
    while True:
        yield j
        j += 1
