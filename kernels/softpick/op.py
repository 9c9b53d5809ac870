"""Softpick attention (the paper "Softpick"): ``ReLU(e^z - 1) / (sum_{j<=r} |e^z - 1| + eps)``.

The FlashAttention-style online form of the paper's Algorithm: with the running shift
``m = max(0, max_j z_j)`` both sums are carried as ``sum (e^{z-m} - e^{-m})`` (ReLU'd, and absolute) and
rescaled by ``e^{m_old - m_new}`` when ``m`` grows; ``eps`` enters as ``eps * e^{-m}`` at the end. The backward
recomputes ``e^{z-m} / l`` per tile: ``dz_j = e^{z_j-m}/l * (1(z_j>0) do.v_j - sign(z_j) do.o)``. Kernels in
``utils/rowwise.py`` (mechanism code ``SOFTPICK``); gradients to q, k, v, ``row_scale`` (scalable softpick) and
``slopes``.
"""

from __future__ import annotations

from lengthbench.kernels.defaults import SOFTPICK_EPS
from lengthbench.kernels.utils.rowwise import SOFTPICK, rowwise


def softpick_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=None, eps=SOFTPICK_EPS,
                       tuning: dict | None = None):
    """Softpick attention, ``[B, H, T, D]`` causal; ``tuning``: launch settings (``utils.rowwise.launch_settings``)."""
    return rowwise(q, k, v, mech=SOFTPICK, slopes=slopes, row_scale=row_scale, sm_scale=sm_scale, eps=eps,
                   tuning=tuning)
