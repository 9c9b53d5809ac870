"""Sieve attention (seed 004): stick-breaking over the support of 1.5-entmax of the earlier keys.

Two stages, as Appendix C: the threshold kernel of ``entmax.py`` finds ``tau_r`` of 1.5-entmax over
``z_{r, j<r}`` (Newton passes over the key tiles, no score matrix kept); the stick-breaking kernels of
``stickbreaking.py`` then run with the filter ``z_rj / 2 > tau_r`` (the support: its weights
``(z/2 - tau)_+^2`` are positive exactly there), the remainder on the diagonal. This is the definition
(Section 3.1), not Algorithm 1's ``z >= rowmax - eps``. No gradient flows through the support; ``row_scale``
and ``slopes`` receive gradients through the stick-breaking stage.
"""

from __future__ import annotations

import torch

from lengthbench.kernels.entmax import entmax_threshold
from lengthbench.kernels.stickbreaking import StickBreakingAttention


def sieve_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=None, alpha=1.5):
    """Sieve attention, ``[B, H, T, D]`` causal (``alpha`` must be 1.5)."""
    if float(alpha) != 1.5:
        raise ValueError(f"the sieve kernel implements alpha = 1.5 only, got {alpha}")
    with torch.no_grad():
        tau = entmax_threshold(q, k, slopes=slopes, row_scale=row_scale, sm_scale=sm_scale, strict=True)
    return StickBreakingAttention.apply(q, k, v, slopes, row_scale, tau, sm_scale)
