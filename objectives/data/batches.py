"""The last stage: the training rows each optimizer step reads from a packed cache, in the batch order.

Batch order: training rows are read in epochs, each a permutation of all rows drawn from the data seed and the
epoch number (and the trial's ``order_seed`` where it has one). Sample ``g`` of the run (counting rows over all
steps) is row ``perm_{g // n}[g % n]``, so the stream depends only on the cache and the seed(s): without an order
seed every architecture of a sweep sees identical batches, and sweeps with different batch sizes see the same
rows in the same order; a trial with its own order seed (a sweep's ``seeds = "per_trial"``) sees its own order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .cache import PackedData


def rows_per_batch(batch_tokens: int, seq_len: int) -> int:
    """Packed rows per optimizer step (a TrialConfig's batch is whole rows of seq_len predicted tokens)."""
    return batch_tokens // seq_len


@dataclass
class Batches:
    """The training batches of a memory-mapped cache (objectives.data.cache.open_packed): ``rows_per_step``
    rows a step, in the batch order (module docstring) of the data seed and ``order_seed`` (None: none)."""

    packed: PackedData
    rows_per_step: int
    order_seed: int | None = None
    _perms: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    def rows(self, step: int) -> np.ndarray:
        """Row indices of optimizer step ``step`` (see the module docstring for the order)."""
        n = len(self.packed.train)
        g = step * self.rows_per_step + np.arange(self.rows_per_step)
        epochs, positions = np.divmod(g, n)
        return np.concatenate([self._perm(int(e))[positions[epochs == e]] for e in np.unique(epochs)])

    def batch(self, step: int, rank: int = 0, world: int = 1) -> np.ndarray:
        """(rows_per_step / world, T + 1) int64 tokens of step ``step``: the ``rank``-th of ``world`` equal
        contiguous parts of the step's rows (all of them for one worker)."""
        rows = self.rows(step)
        part = len(rows) // world
        return self.packed.train[rows[rank * part:(rank + 1) * part]].astype(np.int64)

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            own = [] if self.order_seed is None else [self.order_seed]
            rng = np.random.default_rng([self.packed.meta["data"]["seed"], 3, epoch, *own])
            self._perms[epoch] = rng.permutation(len(self.packed.train))
        return self._perms[epoch]
