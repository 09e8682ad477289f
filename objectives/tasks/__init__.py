"""Downstream tasks: a task set read from its files or generated from a seed, and scored on a language model.

``bundle`` reads a DCLM / CORE-style bundle (a YAML beside ``eval_data/GROUP/FILE.jsonl``) unchanged; ``probes``
generates the built-in probes, one or more per axis, and the probe-format documents a data spec may mix into
training; ``prompts`` renders an item with its few-shot examples; ``scoring`` scores a task on a module;
``tokens`` is a trained trial's tokenizer as scoring needs it. The format, the scoring and their source:
docs/downstream.md.
"""
