"""Which spec keys differ between two sweeps, and which of those differences cannot change the loss.

Delta-phi (``analysis.compare``) is only a diagnostic of what actually differs between the sweeps. The specs
are read from each sweep's parent run in MLflow (the ``spec.toml`` artifact ``search`` logs, ``--set``
overrides included), flattened to dotted keys (``template.injection``, ``recipe.base_lr``) and compared key by
key; keys that only say where a sweep runs or logs are left out.

Under the ``simulate`` objective a trial's loss is the joint law evaluated at its N_once, N_rec and D
(``objectives.simulate``): the training recipe, the data, the learning-rate calibration and the resources never
reach it, and the loop's design (injection, truncated backprop, lanes) reaches it only through the parameter
counts, so a sweep that varies them measures the law's phi both times.
"""

from __future__ import annotations

from typing import Any

WHERE_KEYS = frozenset({"name", "tracking_uri", "storage", "cache_dir", "address", "max_concurrent"})
# Keys the simulated loss never reads (prefixes end in '.'), and the loop's design, which it reads only as sizes.
SIMULATE_IGNORES = ("recipe.", "data.", "calibrate.", "resources.")
SIMULATE_SIZES_ONLY = ("template.injection", "template.bptt_k", "template.lanes")
UNSET = "(unset)"


def flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"template": {"depth": 6}} -> {"template.depth": 6}; lists and scalars are leaves."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def spec_differences(spec_a: dict[str, Any], spec_b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, value in A, value in B) for every design key the two parsed specs set differently."""
    a, b = flatten(spec_a), flatten(spec_b)
    keys = sorted(k for k in set(a) | set(b) if k.split(".")[0] not in WHERE_KEYS)
    return [(k, a.get(k, UNSET), b.get(k, UNSET)) for k in keys if a.get(k, UNSET) != b.get(k, UNSET)]


def inert_differences(differences: list[tuple[str, Any, Any]], objective_a: str, objective_b: str) -> list[str]:
    """A warning per difference that cannot act on the loss of either sweep (both simulated), or one line when
    the sweeps do not share an objective."""
    if objective_a != objective_b:
        return [f"the sweeps use different objectives ({objective_a} vs {objective_b}): Delta-phi mixes the "
                "simulated law with training"]
    if objective_a != "simulate":
        return []
    warnings = []
    for key, _, _ in differences:
        if key.startswith(SIMULATE_IGNORES):
            warnings.append(f"{key} differs, but the simulate objective never reads it: it cannot change phi")
        elif key in SIMULATE_SIZES_ONLY:
            warnings.append(f"{key} differs, but the simulate objective ignores it except through the parameter "
                            "counts: both sweeps measure the simulated law's phi")
    return warnings


def differences_text(differences: list[tuple[str, Any, Any]], name_a: str, name_b: str) -> list[str]:
    if not differences:
        return [f"spec keys: {name_a} and {name_b} set the same design"]
    return [f"spec keys that differ ({name_a} -> {name_b}):"] + [f"  {k}: {a!r} -> {b!r}" for k, a, b in differences]
