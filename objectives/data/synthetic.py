"""A synthetic corpus with an exactly known entropy floor: Zipf-distributed keys with hashed values and noise.

The corpus is a stream of independent records, each ``key_len + value_len + 1`` tokens long::

    k_1 .. k_L   v_1 .. v_M   SEP

* the key id ``k`` is drawn from a Zipf law over ``n_keys`` ids, ``P(k) = (k + 1)^-zipf / Z``, and written as
  its ``key_len`` base-``alphabet`` digits (most significant first);
* each value token is the key's fixed "hashed" value ``table[k, j]`` (a uniform random table drawn once from the
  seed), replaced with probability ``noise`` by a uniform draw from the alphabet (which may hit the true value);
* ``SEP`` (token id ``alphabet``) closes the record, so token ids run over ``alphabet + 1`` symbols.

Learning it takes what language modelling takes: frequent keys are cheap to learn, the long Zipf tail needs
memorising ``n_keys * value_len`` values (capacity), and noise sets an irreducible loss. Given the full past,
the records are i.i.d. and aligned, so the entropy rate (nats per token) is exact::

    E = (H_key + value_len * H_value + 0) / (key_len + value_len + 1)
    H_key   = -sum_k P(k) log P(k)                                 (the key's digits jointly)
    H_value = -p log p - (alphabet - 1) q log q,  q = noise / alphabet,  p = 1 - noise + q
    SEP is certain given the position, so it costs 0.

``synthetic_entropy_floor`` returns E; ``true_log_probs`` scores a token stream under the generating
distribution, so a test (or a user) can check that a fitted irreducible loss lands near E.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .spec import SYNTHETIC_DEFAULTS, check_synthetic


def synthetic_params(data: dict[str, Any]) -> dict[str, Any]:
    """The generator's parameters: ``SYNTHETIC_DEFAULTS`` overridden by the keys given in ``data``."""
    return {key: data.get(key, default) for key, default in SYNTHETIC_DEFAULTS.items()}


def record_len(params: dict[str, Any]) -> int:
    return params["key_len"] + params["value_len"] + 1


def key_probs(params: dict[str, Any]) -> np.ndarray:
    """P(k) proportional to (k + 1)^-zipf over the n_keys key ids."""
    weights = np.arange(1, params["n_keys"] + 1, dtype=np.float64) ** -float(params["zipf"])
    return weights / weights.sum()


def value_probs(params: dict[str, Any]) -> tuple[float, float]:
    """(p, q): probability of a value token being the key's true value, and of each other symbol."""
    q = float(params["noise"]) / params["alphabet"]
    return 1.0 - float(params["noise"]) + q, q


def synthetic_entropy_floor(params: dict[str, Any]) -> float:
    """Entropy rate of the synthetic corpus in nats per token (module docstring); ``params`` as in the data spec."""
    params = synthetic_params(params)
    check_synthetic(params)
    pk = key_probs(params)
    h_key = float(-(pk * np.log(pk)).sum())
    p, q = value_probs(params)
    h_value = -_xlogx(p) - (params["alphabet"] - 1) * _xlogx(q)
    return (h_key + params["value_len"] * h_value) / record_len(params)


def _xlogx(x: float) -> float:
    return x * np.log(x) if x > 0 else 0.0


def _key_digits(keys: np.ndarray, params: dict[str, Any]) -> np.ndarray:
    """(R,) key ids -> (R, key_len) base-alphabet digits, most significant first."""
    powers = params["alphabet"] ** np.arange(params["key_len"] - 1, -1, -1, dtype=np.int64)
    return (keys[:, None] // powers) % params["alphabet"]


def value_table(params: dict[str, Any], seed: int) -> np.ndarray:
    """The (n_keys, value_len) true values, a fixed function of the seed (the "hash")."""
    rng = np.random.default_rng([seed, 1])
    return rng.integers(0, params["alphabet"], size=(params["n_keys"], params["value_len"]))


def synthetic_documents(params: dict[str, Any], seed: int) -> list[np.ndarray]:
    """The corpus as documents of ``doc_records`` whole records each (int64 token ids), from the seed."""
    n_docs = params["tokens"] // (record_len(params) * params["doc_records"])
    if n_docs < 2:
        raise ValueError(f"synthetic data: tokens={params['tokens']} makes fewer than two documents of "
                         f"{params['doc_records']} records")
    n_records = n_docs * params["doc_records"]
    rng = np.random.default_rng([seed, 2])
    keys = rng.choice(params["n_keys"], size=n_records, p=key_probs(params))
    values = value_table(params, seed)[keys]
    noisy = rng.random(values.shape) < float(params["noise"])
    values = np.where(noisy, rng.integers(0, params["alphabet"], size=values.shape), values)
    sep = np.full((n_records, 1), params["alphabet"], dtype=np.int64)
    records = np.concatenate([_key_digits(keys, params), values, sep], axis=1)
    return list(records.reshape(n_docs, -1))


def true_log_probs(stream: np.ndarray, params: dict[str, Any], seed: int) -> np.ndarray:
    """log P(token | full past) under the generating distribution, for a stream that starts at a record
    boundary (as the packed cache of a synthetic source does). Shape (n,), nats, one per token."""
    params = synthetic_params(params)
    rec = record_len(params)
    n_rec = len(stream) // rec
    records = np.asarray(stream[: n_rec * rec], dtype=np.int64).reshape(n_rec, rec)
    key_len, value_len = params["key_len"], params["value_len"]
    powers = params["alphabet"] ** np.arange(key_len - 1, -1, -1, dtype=np.int64)
    keys = records[:, :key_len] @ powers
    pk = key_probs(params)
    # The key digits jointly carry log P(k); spread it over the digits as the chain rule of prefix sums does.
    key_prefix_mass = np.stack([_prefix_mass(pk, records[:, :j + 1], powers, key_len, params["alphabet"])
                                for j in range(key_len)], axis=1)
    key_lp = np.diff(np.log(np.concatenate([np.ones((n_rec, 1)), key_prefix_mass], axis=1)), axis=1)
    p, q = value_probs(params)
    hit = records[:, key_len:key_len + value_len] == value_table(params, seed)[keys]
    value_lp = np.where(hit, np.log(p), np.log(q))
    sep_lp = np.where(records[:, -1] == params["alphabet"], 0.0, -np.inf)[:, None]
    return np.concatenate([key_lp, value_lp, sep_lp], axis=1).reshape(-1)


def _prefix_mass(pk: np.ndarray, digits: np.ndarray, powers: np.ndarray, key_len: int, alphabet: int) -> np.ndarray:
    """P(first j digits of the key equal ``digits``) for every record; digits is (R, j)."""
    j = digits.shape[1]
    span = alphabet ** (key_len - j)  # key ids sharing a j-digit prefix form one contiguous block
    start = digits @ powers[:j]
    cumulative = np.concatenate([[0.0], np.cumsum(pk)])
    lo = np.minimum(start, len(pk))
    hi = np.minimum(start + span, len(pk))
    return cumulative[hi] - cumulative[lo]
