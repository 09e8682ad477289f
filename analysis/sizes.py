"""Model sizes as smooth functions of width, taken from ``model``'s accounting (never recounted here).

For a fixed template and r, every count of ``model.account`` (for LoopedLM: 12 d^2 + 2 d per block, 2 d^2
injection, V d embedding, d-sized norms; 6 x parameters + 12 d T L_eff attention FLOPs; a measured architecture
of linear and attention layers alike) is a quadratic polynomial in the width d. ``SizeCurve.from_model`` reads the three coefficients off the model at
three buildable widths and checks them at two more, so a change in ``model`` that broke the polynomial form
fails loudly instead of drifting. The curve lets the allocation optimise width continuously and lets the
IsoFLOP analysis map an optimum N* back to a width.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

from loopscale.model import ISO_DEPTH, LoopedConfig, account, iso_depth_template

if TYPE_CHECKING:
    import pandas as pd

# The paper's iso-depth template (model/config.py) and batch size in tokens (docs/paper.md).
PAPER_TEMPLATE: dict[str, Any] = dict(ISO_DEPTH)
PAPER_BATCH_TOKENS = 262_144
QUANTITIES = ("N_once", "N_rec", "N_embed", "F")


@dataclass(frozen=True)
class SizeCurve:
    """N_once, N_rec, N_embed and F (training FLOPs per token) as exact quadratics in width, for one r."""

    r: int
    template: dict[str, Any]
    coefficients: dict[str, tuple[float, float, float]] = field(repr=False)  # (c0, c1, c2) per quantity

    @classmethod
    def from_model(cls, r: int, template: dict[str, Any] | None = None) -> "SizeCurve":
        template = dict(PAPER_TEMPLATE if template is None else template)
        head_dim = iso_depth_template(template)["head_dim"]
        sample = [_model_sizes(k * head_dim, r, template) for k in (1, 2, 3)]
        coefficients = {q: _quadratic_through([(d, sizes[q]) for d, sizes in sample]) for q in QUANTITIES}
        curve = cls(r=r, template=template, coefficients={q: tuple(map(float, c)) for q, c in coefficients.items()})
        for k in (7, 40):
            d, sizes = _model_sizes(k * head_dim, r, template)
            for q in QUANTITIES:
                c0, c1, c2 = coefficients[q]
                if c0 + c1 * d + c2 * d * d != sizes[q]:
                    raise ValueError(f"model's {q} is not quadratic in width for template {template}, r={r}")
        return curve

    def sizes(self, width) -> dict[str, np.ndarray]:
        """N_once, N_rec, N (= N_once + N_rec), N_embed and F at (possibly fractional) widths."""
        d = np.asarray(width, dtype=float)
        out = {q: c0 + c1 * d + c2 * d * d for q, (c0, c1, c2) in self.coefficients.items()}
        out["N"] = out["N_once"] + out["N_rec"]
        return out

    def width_where(self, quantity: str, value) -> np.ndarray:
        """The width at which ``quantity`` (N or one of QUANTITIES; all grow with width) equals ``value``."""
        if quantity == "N":
            c0, c1, c2 = (a + b for a, b in zip(self.coefficients["N_once"], self.coefficients["N_rec"]))
        else:
            c0, c1, c2 = self.coefficients[quantity]
        v = np.asarray(value, dtype=float)
        return (-c1 + np.sqrt(c1 * c1 - 4 * c2 * (c0 - v))) / (2 * c2)

    @property
    def width_unit(self) -> int:
        return iso_depth_template(self.template)["width_unit"]

    @property
    def head_dim(self) -> int:
        return iso_depth_template(self.template)["head_dim"]

    def config(self, width: int) -> LoopedConfig:
        """The buildable model of exactly ``width`` (a multiple of head_dim)."""
        config = LoopedConfig.iso_depth(width / self.width_unit, self.r, **self.template)
        if config.width != width:
            raise ValueError(f"width {width} is not buildable with head_dim {self.head_dim}")
        return config


def _model_sizes(width: int, r: int, template: dict[str, Any]) -> tuple[int, dict[str, int]]:
    config = LoopedConfig.iso_depth(width / iso_depth_template(template)["width_unit"], r, **template)
    p = account(config)
    return config.width, {"N_once": p.N_once, "N_rec": p.N_rec, "N_embed": p.N_embed, "F": p.flops_per_token}


def _quadratic_through(points: list[tuple[int, int]]) -> tuple[Fraction, Fraction, Fraction]:
    """Exact (c0, c1, c2) of the parabola through three integer points (Lagrange, in rationals)."""
    (x0, y0), (x1, y1), (x2, y2) = [(Fraction(x), Fraction(y)) for x, y in points]
    c2 = ((y2 - y0) / (x2 - x0) - (y1 - y0) / (x1 - x0)) / (x2 - x1)
    c1 = (y1 - y0) / (x1 - x0) - c2 * (x0 + x1)
    c0 = y0 - c1 * x0 - c2 * x0 * x0
    return c0, c1, c2


def template_mismatch(used: pd.DataFrame, template: dict[str, Any]) -> str:
    """'' when the template reproduces the runs' sizes and FLOPs per token at their widths, else why not, naming
    what differs (never the whole template). At r > 1 the sizes are N_once and N_rec; at r = 1 their sum N, all
    the law reads there (r^phi = 1): how a plain stack's N splits is a name, and the closed form and a measured
    architecture name it alike (model/measured.py), but a runs table need not."""
    for r, group in used.groupby("r"):
        row = group.iloc[0]
        if not np.isfinite(row["width"]):
            return "runs do not record their width; cannot check the template"
        try:
            sizes = SizeCurve.from_model(int(r), template).sizes(row["width"])
        except (ValueError, TypeError) as err:
            return f"the template does not build r={int(r)}: {err}"
        recorded = {"N_once": row["N_once"], "N_rec": row["N_rec"], "F": row["flops_per_token"]}
        if r == 1:
            recorded = {"N": row["N_once"] + row["N_rec"], "F": row["flops_per_token"]}
        for quantity, value in recorded.items():
            if np.isfinite(value) and not np.isclose(sizes[quantity], value, rtol=1e-9):
                name = "FLOPs per token" if quantity == "F" else quantity
                return (f"the template{_architecture_of(template)} gives {name} {float(sizes[quantity]):.6g} at "
                        f"width {row['width']:.0f}, r={int(r)}; the runs record {value:.6g}")
    return ""


def _architecture_of(template: dict[str, Any]) -> str:
    """' (architecture NAME)' for a template of an own architecture, else ''."""
    return f" (architecture {template['architecture']})" if template.get("architecture") else ""
