"""Sampled depth: how many recurrences a training step of ``depth_sampling = "uniform"`` runs.

Huginn (Geiping et al. 2025, "Scaling up Test-Time Compute with Latent Reasoning") trains a recurrent-depth model
at a depth drawn anew for every step, so that it learns a state that keeps improving when run more or fewer times
than on average; it draws s - 1 ~ Poisson(exp(tau)), tau ~ N(log r - sigma^2 / 2, sigma), and back-propagates
through the last k recurrences only. loopscale draws s uniformly instead:

    P(s) = 1 / (2r - 1)  for s in {1, ..., 2r - 1}         E[s] = r

* its mean is the trial's r exactly, so the r of the runs table and of the law is the mean depth the trial
  trained at;
* its support is bounded: no step runs more than 2r - 1 recurrences (Huginn's tail is unbounded), so a step's
  time and memory are known before it runs;
* its probabilities are rational, so the expected FLOPs per token (model/accounting.py) are an exact fraction
  and the budget buys whole steps exactly, as at fixed depth; a log-normal Poisson's probabilities are
  integrals without a closed form.

The draw of step t is a pure function of (seed, t): ``u = sha256("depth|seed|t")`` read as a fraction in [0, 1),
s the first value whose cumulative probability exceeds u. A resumed trial, a warmdown branch re-running a step
and every data-parallel worker therefore draw the same s at the same step, and every trial of a sweep (one seed)
the same sequence of uniforms: common random numbers across widths, like the sweep's shared batch order.
"""

from __future__ import annotations

import hashlib
from fractions import Fraction

from .config import LoopedConfig


def depth_pmf(config: LoopedConfig) -> dict[int, Fraction]:
    """P(s) of every depth s a training step of ``config`` may run (module docstring); {r: 1} at fixed depth."""
    if config.depth_sampling == "fixed":
        return {config.r: Fraction(1)}
    top = 2 * config.r - 1
    return {s: Fraction(1, top) for s in range(1, top + 1)}


def draw_depth(config: LoopedConfig, seed: int, step: int) -> int:
    """The depth s of training step ``step`` of a trial seeded ``seed`` (module docstring)."""
    digest = hashlib.sha256(f"depth|{seed}|{step}".encode()).digest()
    u = Fraction(int.from_bytes(digest[:8], "little"), 2**64)
    cumulative = Fraction(0)
    for s, p in depth_pmf(config).items():
        cumulative += p
        if u < cumulative:  # the probabilities sum to 1 > u: the last s at the latest
            break
    return s
