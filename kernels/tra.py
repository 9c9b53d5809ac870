"""Threshold rectified attention (Threshold Differential Attention): ``(s_rj - tau_r)_+^power``, no normaliser.

The caller passes unit-norm ``q`` and ``k`` with ``sm_scale=1`` (the module does: its scores are the
cosine scores). ``tau_r = beta * sqrt(2 * max(0, log((n_r + 1) / kappa)) / d)`` (``n_r = r + 1``, ``d`` the
head dim) is formed here with autograd, so a learnable ``beta`` (float, 0-d or ``[H]`` tensor) gets its
gradient from the kernel's per-row ``dL/dtau_r = -sum_j dL/dz_rj``. The RMSNorm on the output is the
module's. Kernels in ``_rowwise.py`` (code ``TRA``). TDA runs as two calls of this op (it is linear in
the weights) until its one-pass op (``tda.py``) is verified on a GPU; see ``models/attention/threshold.py``.
"""

from __future__ import annotations

import math

import torch

from lengthbench.kernels._rowwise import TRA, rowwise


def tra_threshold(tokens: int, head_dim: int, beta, kappa: float, device) -> torch.Tensor:
    """``tau`` broadcastable to ``[B, H, T]``: ``[T]`` for a float ``beta``, ``[H, T]`` for a per-head one."""
    n = torch.arange(1, tokens + 1, device=device, dtype=torch.float32)
    base = torch.sqrt(2.0 * torch.clamp(torch.log((n + 1.0) / kappa), min=0.0) / head_dim)
    if not torch.is_tensor(beta):
        return float(beta) * base
    beta = beta.to(device, torch.float32)
    return beta[:, None] * base if beta.dim() == 1 else beta * base


def tra_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=1.0, beta=1.0, kappa=1.0, power=2.0):
    """TRA, ``[B, H, T, D]`` causal; ``q``, ``k`` unit-norm (cosine scores with ``sm_scale=1``)."""
    if sm_scale is None:
        sm_scale = 1.0
    if not math.isfinite(float(power)) or float(power) <= 0:
        raise ValueError(f"tra power must be positive, got {power}")
    tau = tra_threshold(q.shape[-2], q.shape[-1], beta, float(kappa), q.device)
    return rowwise(q, k, v, mech=TRA, slopes=slopes, row_scale=row_scale, tau=tau, sm_scale=sm_scale,
                   power=float(power))
