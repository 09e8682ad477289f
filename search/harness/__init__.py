"""Adapters to outside evaluation harnesses, each importing its harness (an optional install) only when it is
itself imported: ``lm_eval_model``, a kept model as an lm-evaluation-harness model."""
