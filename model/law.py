"""The iso-depth joint scaling law of looped language models (Schwethelm et al. 2026, Eq. 2).

    L(N_once, N_rec, r, D) = E + A * N_eff^(-alpha) + B * D^(-beta),   N_eff = N_once + r^phi * N_rec

phi = 1: a recurrence is worth as much as a unique block; phi = 0: it adds no capacity. The simulated
objective evaluates it and the analysis fits it; both take the definition from here. Works on Python floats
and on numpy arrays alike (no numpy import, so ``model`` depends on torch only).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class JointLaw:
    E: float
    A: float
    alpha: float
    B: float
    beta: float
    phi: float

    def n_eff(self, N_once, N_rec, r):
        """Effective parameters: N_once + r^phi * N_rec."""
        return N_once + r ** self.phi * N_rec

    def loss(self, N_once, N_rec, r, D):
        """Predicted loss in nats per token."""
        return self.E + self.A * self.n_eff(N_once, N_rec, r) ** (-self.alpha) + self.B * D ** (-self.beta)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


# The paper's joint fit on all 116 runs (Sec. 4; R^2 0.9972). It reports an interval for phi alone, its 95% CI.
PAPER_LAW = JointLaw(E=1.56773, A=28.027, alpha=0.19924, B=915.82, beta=0.36863, phi=0.459)
PAPER_PHI_CI = (0.41, 0.53)
