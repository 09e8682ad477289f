"""A trial's data, one stage a module, in the order the data flows::

    spec -> synthetic -> sources -> tokenizers -> bpe -> cache -> batches

``spec`` the data spec's keys, defaults and checks; ``synthetic`` the corpus with a known entropy floor;
``sources`` documents in a seeded order; ``tokenizers`` bytes, a tokenizers file or a hub id; ``bpe`` the
tokenizer trained on the source itself; ``cache`` tokenise, pack, memory-map (the data fingerprint);
``batches`` the training rows of each optimizer step. A module imports only the stages before it, and this
package none of them (tests/test_import_graph.py).
"""
