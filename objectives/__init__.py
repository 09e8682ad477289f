"""What ONE trial does: data -> train to a FLOP budget -> metrics, or the simulated law."""

from .data.bpe import train_bpe
from .data.cache import data_fingerprint, open_packed, prepare_data
from .data.spec import validate_data
from .data.synthetic import synthetic_entropy_floor
from .data.tokenizers import vocab_size_of
from .peak import device_peak_flops
from .recipe import RECIPE_DEFAULTS, normalize_recipe, trial_lrs, validate_recipe
from .simulate import simulate
from .train import train
from .trial import METRIC_KEYS, RESUME_KEYS, TrialConfig

__all__ = [
    "METRIC_KEYS", "RECIPE_DEFAULTS", "RESUME_KEYS", "TrialConfig", "data_fingerprint", "device_peak_flops", "normalize_recipe",
    "open_packed", "prepare_data", "simulate", "synthetic_entropy_floor", "train", "train_bpe", "trial_lrs",
    "validate_data", "validate_recipe", "vocab_size_of",
]
