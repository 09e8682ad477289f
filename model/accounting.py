"""THE definition of unique parameters, training FLOPs per token and tokens for a budget.

Everything else in loopscale (search, objectives, analysis) asks this module (``account``,
``tokens_for_budget``); nothing recounts. ``account`` dispatches on the config's architecture: the built-in
``LoopedLM`` is counted in closed form (below), so counting a candidate width allocates nothing; any other
architecture is measured from its module on the meta device (model/measured.py). ``tests/test_accounting.py``
checks every group against the real ``LoopedLM`` module and the FLOPs against ``torch.utils.flop_counter``, and
tests/test_measured.py the measured counts of ``LoopedLM`` against this closed form.

Counting follows Schwethelm et al. 2026 (docs/paper.md, "What is counted"):

* a block has ``12 d^2`` matrix parameters (q, k, v, o: 4 d^2; MLP d -> 4d -> d: 8 d^2) plus two RMSNorm
  scale vectors (2 d); QK-norm has no parameters; no biases.
* ``N_once`` = prelude + coda blocks + the model-level norm scales that run once (after the embedding,
  before the head); ``N_rec`` = the shared block (+ its end-of-recurrence norm when looped) + injection
  (``2 d^2`` for linear injection; ``r (K^2 + 2 K)`` lane weights for hyperconnections with K lanes: each
  recurrence has its own alpha (K), M (K x K), beta (K)). ``N = N_once + N_rec`` excludes the embedding and
  the LM head.
* training FLOPs per token, as the paper's code counts them::

      F = 6 (P_prelude + P_coda + P_head + r (P_recur + P_inject)) + 12 h q T L_eff

  with P_* including their norm scales (P_head = LM head + final norm), attention counted full (not halved
  for causality), embedding lookup and softmax excluded. P_inject is what one recurrence's injection
  multiplies per token: 2 d^2 (linear), (K^2 + 2 K) d for hyperconnections (reading K lanes with alpha: K d;
  the lane update [M | beta] over [lanes; s]: K (K + 1) d; the paper's code counts the same (K^2 + 2K) d).
  Truncated backprop: each of the r - k
  forward-only recurrences costs 2 P (no backward) and 4 h q T per layer instead of 6 P and 12 h q T.
* sampled depth (``depth_sampling``, model/depth.py): a step that runs s recurrences costs F(s), the formula
  above with s for r and min(s, k) for k (forward over all s, backward over the last min(s, k)); its FLOPs per
  token are the exact expectation over the step's depth, a fraction::

      F = sum_s P(s) F(s)

  The budget's tokens, the plan and the analysis use it; the FLOPs a trial's drawn steps ran differ from F
  tokens by their sampling noise only (tests/test_sampled_depth.py counts them).

Serving (``inference``), at a context length T_ctx, for the built-in:

* forward FLOPs per token: the forward third of the training formula at T = T_ctx, every recurrence run::

      F_fwd = 2 (P_prelude + P_coda + P_head + r (P_recur + P_inject)) + 4 h q T_ctx L_eff

  (2 FLOPs per weight and token forward, Kaplan et al. 2020 Sec. 2.1; attention as the paper counts it, QK^T
  and AV over the full context). A token generated at position t < T_ctx attends to t tokens and costs less;
  F_fwd is the cost at a full context, an upper bound for every token of it.
* KV-cache entries per token: 2 h q L_eff. Every block application computes its keys and values from its own
  input, and a looped block's input changes with every recurrence, so the cache holds one K and one V per
  application: per loop, r times those of a shared layer (no sharing across recurrences assumed; a design that
  recomputes or shares them needs less). Bytes follow from the dtype (``DTYPE_BYTES``).
* weights: every parameter, N + N_embed (embedding and LM head are held to serve, though not counted in N).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fractions import Fraction

from .config import LoopedConfig
from .counts import Accounting, InferenceCost
from .depth import depth_pmf


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts by named group; ``total`` is every parameter of the module."""

    embedding: int
    lm_head: int
    prelude: int
    recur: int
    coda: int
    inject: int
    scalars: int  # model-level norm scales that run once: after the embedding and before the head
    total: int

    def __post_init__(self) -> None:
        parts = self.embedding + self.lm_head + self.prelude + self.recur + self.coda + self.inject + self.scalars
        assert parts == self.total, f"parameter groups sum to {parts}, total is {self.total}"

    @property
    def N_once(self) -> int:
        """Unique non-embedding parameters applied once per token (prelude, coda, model-level norms)."""
        return self.prelude + self.coda + self.scalars

    @property
    def N_rec(self) -> int:
        """Unique parameters of the recurrent part (shared block and injection), applied r times."""
        return self.recur + self.inject

    @property
    def N(self) -> int:
        """Unique non-embedding parameters, the paper's N."""
        return self.N_once + self.N_rec

    @property
    def N_embed(self) -> int:
        """Embedding and LM head parameters (excluded from N, as in the paper)."""
        return self.embedding + self.lm_head


def account(config: LoopedConfig) -> Accounting:
    """THE counts of ``config``: closed form for the built-in LoopedLM, measured for any other architecture."""
    if not config.builtin:
        from .measured import measure  # torch: only a user architecture pays for it

        return measure(config)
    p = count_params(config)
    return Accounting(N_once=p.N_once, N_rec=p.N_rec, N_embed=p.N_embed, flops_per_token=flops_per_token(config))


def _closed_form_only(config: LoopedConfig) -> None:
    if not config.builtin:
        raise ValueError(f"the closed-form counts are LoopedLM's, not {config.architecture!r}'s: ask "
                         f"model.account, which measures it")


def block_params(width: int, mlp_ratio: int = 4) -> int:
    """One transformer block: q, k, v, o (4 d^2) + MLP (2 * mlp_ratio * d^2) + two RMSNorm scales (2 d)."""
    return 4 * width * width + 2 * mlp_ratio * width * width + 2 * width


def inject_params(config: LoopedConfig) -> int:
    """Linear injection u = W [e; h] with W of shape d x 2d; hyperconnections r (K^2 + 2K) lane weights;
    additive and none have no parameters."""
    if config.injection == "linear":
        return 2 * config.width * config.width
    if config.injection == "hyperconnect":
        return config.r * (config.lanes * config.lanes + 2 * config.lanes)
    return 0


def inject_matmul_params(config: LoopedConfig) -> int:
    """Multiply-adds per token of ONE recurrence's injection (its P_inject in the FLOP formula)."""
    if config.injection == "hyperconnect":
        return (config.lanes * config.lanes + 2 * config.lanes) * config.width
    return inject_params(config)


def count_params(config: LoopedConfig) -> ParamCounts:
    """Closed-form parameter counts of ``LoopedLM(config)`` by group (no module is built)."""
    _closed_form_only(config)
    d = config.width
    block = block_params(d, config.mlp_ratio)
    recur_norm = d if config.looped else 0  # the norm at the end of every recurrence exists only when looped
    groups = dict(
        embedding=config.vocab_size * d,
        lm_head=config.vocab_size * d,
        prelude=config.n_prelude * block,
        recur=config.n_recur * block + recur_norm,
        coda=config.n_coda * block,
        inject=inject_params(config),
        scalars=2 * d,
    )
    return ParamCounts(**groups, total=sum(groups.values()))


def attention_flops_per_layer(config: LoopedConfig, backward: bool = True) -> int:
    """Attention score and value FLOPs per token per layer: 4 h q T forward (QK^T and AV), x3 with backward.

    Counted full T (not halved for the causal mask), as the paper does.
    """
    forward = 4 * config.n_heads * config.head_dim * config.seq_len
    return 3 * forward if backward else forward


def flops_per_token(config: LoopedConfig) -> int | Fraction:
    """Training FLOPs per token (forward + backward) of LoopedLM, the paper's formula with truncated backprop; at
    sampled depth its expectation over the step's depth s, exact (an int where it is whole, else a Fraction)."""
    _closed_form_only(config)
    expected = sum(p * flops_at_depth(config, s) for s, p in depth_pmf(config).items())
    return expected.numerator if expected.denominator == 1 else expected


def flops_at_depth(config: LoopedConfig, s: int) -> int:
    """Training FLOPs per token of a LoopedLM step that runs the shared block s times, gradients through the last
    ``config.grad_recurrences_at(s)`` of them (module docstring)."""
    _closed_form_only(config)
    p = count_params(config)
    head = p.lm_head + config.width  # LM head matrix + the final norm before it
    per_recurrence = p.recur + inject_matmul_params(config)
    k = config.grad_recurrences_at(s)
    matmul = 6 * (p.prelude + p.coda + head) + 6 * k * per_recurrence + 2 * (s - k) * per_recurrence
    grad_layers = config.n_prelude + config.n_coda + k * config.n_recur
    nograd_layers = (s - k) * config.n_recur
    attention = (grad_layers * attention_flops_per_layer(config)
                 + nograd_layers * attention_flops_per_layer(config, backward=False))
    return matmul + attention


# Bytes of one number in the dtypes a model is served in.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8": 1}


def inference(config: LoopedConfig, context: int | None = None) -> InferenceCost:
    """THE serving counts of ``config`` at ``context`` tokens (default its seq_len): closed form for the built-in
    LoopedLM (module docstring), measured for any other architecture."""
    context = config.seq_len if context is None else context
    if context < 1:
        raise ValueError(f"context must be a positive number of tokens, got {context}")
    if not config.builtin:
        from .measured import measure_inference  # torch: only a user architecture pays for it

        return measure_inference(config, context)
    counts = account(config)
    return InferenceCost(context=context, forward_flops_per_token=forward_flops_per_token(config, context),
                         kv_entries_per_token=kv_entries_per_token(config),
                         params=counts.N + counts.N_embed)


def forward_flops_per_token(config: LoopedConfig, context: int) -> int:
    """Forward FLOPs per token of LoopedLM at a context of ``context`` tokens, every recurrence run (inference)."""
    _closed_form_only(config)
    p = count_params(config)
    head = p.lm_head + config.width  # LM head matrix + the final norm before it
    matmul = 2 * (p.prelude + p.coda + head) + 2 * config.r * (p.recur + inject_matmul_params(config))
    at_context = dataclasses.replace(config, seq_len=context)
    return matmul + config.effective_depth * attention_flops_per_layer(at_context, backward=False)


def kv_entries_per_token(config: LoopedConfig) -> int:
    """Numbers LoopedLM's KV cache holds per token of context: K and V (h q each) per block application."""
    _closed_form_only(config)
    return 2 * config.n_heads * config.head_dim * config.effective_depth


def tokens_for_budget(config: LoopedConfig, flops: float, batch_tokens: int) -> int:
    """Training tokens D that a budget of ``flops`` buys, in whole optimizer steps of ``batch_tokens``.

    D = floor(C / (F * batch_tokens)) * batch_tokens, so the run never spends more than C and falls short by
    less than one step. Returns 0 when the budget does not buy a single step.
    """
    if not flops > 0 or flops == float("inf"):
        raise ValueError(f"FLOP budget must be positive and finite, got {flops}")
    if batch_tokens <= 0:
        raise ValueError(f"batch_tokens must be positive, got {batch_tokens}")
    per_step = account(config).flops_per_token * batch_tokens  # exact: an int, or a Fraction at sampled depth
    # Exact at any budget, no float division: a finite float is an exact fraction, and so is per_step.
    # (Correcting a float quotient step by step looped ~1e14 times at C = 1e40.)
    return Fraction(flops) // per_step * batch_tokens
