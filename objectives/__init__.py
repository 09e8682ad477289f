"""What ONE trial does: data -> train to a FLOP budget -> metrics, or the simulated law.

Every name resolves on first use (PEP 562, ``model/lazy.py``), so a process loads only what it uses: the driver of
a simulated sweep imports no torch (~1.3 s of CPU a process).
``train`` and ``simulate`` live in ``training`` and ``simulation``, modules named apart from the functions, since
importing a submodule binds its name in the package and would hide a function of the same name.
"""

from loopscale.model.lazy import on_first_use

_EXPORTS = {
    "train_bpe": "data.bpe", "data_fingerprint": "data.cache", "open_packed": "data.cache",
    "prepare_data": "data.cache", "validate_data": "data.spec", "synthetic_entropy_floor": "data.synthetic",
    "vocab_size_of": "data.tokenizers", "device_peak_flops": "peak", "RECIPE_DEFAULTS": "recipe",
    "normalize_recipe": "recipe", "trial_lrs": "recipe", "validate_recipe": "recipe", "simulate": "simulation",
    "train": "training", "METRIC_KEYS": "trial", "RESUME_KEYS": "trial", "TrialConfig": "trial",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = on_first_use(__name__, _EXPORTS)
