"""ReLA (Zhang et al. 2021; a baseline of "Threshold Differential Attention"): unnormalised ``ReLU(z)`` weights; the module applies the RMSNorm.

Kernels in ``utils/rowwise.py`` (code ``RELA``): no row statistic at all, ``dz = 1(z > 0) do.v_j``.
"""

from __future__ import annotations

from lengthbench.kernels.utils.rowwise import RELA, rowwise


def rela_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=None, tuning: dict | None = None):
    """ReLA attention, ``[B, H, T, D]`` causal; ``tuning``: launch settings (``utils.rowwise.launch_settings``)."""
    return rowwise(q, k, v, mech=RELA, slopes=slopes, row_scale=row_scale, sm_scale=sm_scale, tuning=tuning)
