"""A trial's data: the spec, its sources, tokenizers and the packed cache."""
