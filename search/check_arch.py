"""``loopscale check-arch SPEC``: does the spec's architecture keep the contract a sweep relies on?

Per r of the spec, the measured N_once, N_rec, N_embed and training FLOPs per token at the narrowest and the
widest width (model/measured.py; a parameter no forward reads is refused there, and so is a training forward whose
compute depends on the data), and a line when the serving counts cannot be measured (compute that depends on the
data in evaluation mode: an early exit). Then, on CPU at the narrowest
width and the smallest r, on one fixed batch of random tokens (``ROWS`` x ``min(seq_len, TOKENS)``):

* the loss at init, against log V (a uniform prediction): above log V + ``INIT_SLACK`` nats, or not finite,
  is a problem (an init whose logits are far from flat trains from a handicap the law would blame on the size);
* gradients reach every trainable parameter (its ``.grad`` is set after one backward);
* the same seed builds the same model: the loss at init twice, bit for bit;
* ``STEPS`` steps of the spec's recipe on that batch (its optimizers, objectives/recipe.py ``build_optimizers``,
  at the peak rates of a trial of the smallest budget: the groups and rates a sweep trains with) lower the loss;
* those steps move every trainable parameter: one left bit for bit where it started never trains (a matrix
  initialised at zero in MuonH's group, which holds every matrix at its initial norm, stays zero).

Each problem is one line; ``plan`` runs this for any architecture other than the built-in.
"""

from __future__ import annotations

import math

import torch

from loopscale.analysis import numbers
from loopscale.model import account, inference, tokens_for_budget
from loopscale.model.architecture import build, param_groups
from loopscale.model.measured import call_forward
from loopscale.objectives import normalize_recipe
from loopscale.objectives.optimizers import build_optimizers
from loopscale.objectives.recipe import group_lrs

from .spec import SweepSpec

ROWS, TOKENS, STEPS = 2, 64, 5
INIT_SLACK = 1.0  # nats above log V


def check_architecture(spec: SweepSpec) -> tuple[list[str], list[str]]:
    """(report lines, problems) for the spec's architecture; a failure to build or measure raises its one
    ValueError line."""
    name = spec.grid.model(spec.grid.s_min, spec.grid.recurrences[0]).architecture
    report = [f"architecture {name}", f"  {'r':>2} {'width':>6} {'N_once':>12} {'N_rec':>12} {'N_embed':>12} "
                                      f"{'FLOPs/token':>12}"]
    for r in spec.grid.recurrences:
        for s in sorted({spec.grid.s_min, spec.grid.s_max}):
            config = spec.grid.model(s, r)
            a = account(config)
            report.append(f"  {r:>2} {config.width:>6} {a.N_once:>12,} {a.N_rec:>12,} {a.N_embed:>12,} "
                          f"{numbers.flops(a.flops_per_token):>12}")
    config = spec.grid.model(spec.grid.s_min, min(spec.grid.recurrences))
    try:
        inference(config)
    except ValueError as exc:  # an exit in evaluation mode only: it trains at the counted depth, serves at another
        report.append(f"  serving counts not measured: {exc}")
    problems: list[str] = []
    tokens = torch.randint(0, config.vocab_size, (ROWS, min(config.seq_len, TOKENS) + 1),
                           generator=torch.Generator().manual_seed(spec.sampling.seed))
    idx, targets = tokens[:, :-1], tokens[:, 1:]
    model, first = _loss_at_init(config, spec.sampling.seed, idx, targets)
    _, again = _loss_at_init(config, spec.sampling.seed, idx, targets)
    log_v = math.log(config.vocab_size)
    report.append(f"  loss at init {first.item():.4f} nats, log V = {log_v:.4f} (width {config.width}, "
                  f"r={config.r})")
    if not math.isfinite(first.item()) or first.item() > log_v + INIT_SLACK:
        problems.append(f"architecture {name}: loss at init {first.item():.4g} nats, more than log V + "
                        f"{INIT_SLACK:g} = {log_v + INIT_SLACK:.4g} (width {config.width}, r={config.r})")
    if first.item() != again.item():
        problems.append(f"architecture {name}: the same seed gives two losses at init ({first.item():.6g} and "
                        f"{again.item():.6g}): the factory draws from an unseeded source")
    first.backward()
    missed = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    if missed:
        problems.append(f"architecture {name}: no gradient reaches {missed[0]!r}" +
                        (f" (and {len(missed) - 1} more)" if len(missed) > 1 else "") + f" at r={config.r}")
    recipe = normalize_recipe(spec.training.recipe)
    steps = f"{STEPS} steps of the recipe ({recipe['optimizer']})"
    after, still = _trained_loss(model, config, spec, recipe, idx, targets)
    report.append(f"  loss after {steps} on one batch {after:.4f} nats")
    if not after < first.item():
        problems.append(f"architecture {name}: {steps} on one batch did not lower the loss "
                        f"({first.item():.4g} -> {after:.4g} nats)")
    if still:
        matrices = {id(p) for p in param_groups(model, config.vocab_size)["matrices"]}
        held = recipe["optimizer"] == "muonh" and id(model.get_parameter(still[0])) in matrices
        problems.append(f"architecture {name}: {steps} leave {still[0]!r} where it started" +
                        (f" (and {len(still) - 1} more)" if len(still) > 1 else "") +
                        (": a matrix MuonH holds at its initial norm (a zero one stays zero) belongs in "
                         "loopscale_param_groups()'s lanes" if held else ""))
    return report, problems


def _loss_at_init(config, seed: int, idx: torch.Tensor, targets: torch.Tensor):
    torch.manual_seed(seed)
    model = build(config)
    return model, call_forward(model, config.architecture, idx, targets)


def _trained_loss(model: torch.nn.Module, config, spec: SweepSpec, recipe: dict, idx: torch.Tensor,
                  targets: torch.Tensor) -> tuple[float, list[str]]:
    """(loss after ``STEPS`` steps of the recipe on one batch, the trainable parameters they left unchanged)."""
    batch = spec.grid.batch_tokens
    tokens = max(batch, tokens_for_budget(config, min(spec.grid.budgets), batch))
    lrs = group_lrs(recipe, spec.grid.model_template(), config, tokens, batch)
    optimizers = build_optimizers(model, lrs, recipe, config.vocab_size)
    start = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    for _ in range(STEPS):
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        call_forward(model, config.architecture, idx, targets).backward()
        for optimizer in optimizers:
            optimizer.step()
    still = [n for n, p in model.named_parameters()  # not those no gradient reaches: a problem of their own
             if n in start and p.grad is not None and torch.equal(p.detach(), start[n])]
    with torch.no_grad():
        return call_forward(model, config.architecture, idx, targets).item(), still
