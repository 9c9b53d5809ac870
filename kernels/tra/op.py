"""Threshold rectified attention (Threshold Differential Attention, Section 4.1): ``(s_rj - tau_r)_+^power``,
no normaliser.

The caller passes unit-norm ``q`` and ``k`` with ``sm_scale=1`` (the module does: its scores are the
cosine scores). ``tau_r = beta * sqrt(2 * max(0, log((n_r + c) / kappa)) / d)`` (``n_r = r + 1`` keys in row
``r``, ``d`` the head dim; ``c`` 0 for ``tau_index="alg1"``, the paper's Algorithm 1 and the authors' kernel,
``c`` 1 for ``"eq1"``, its Eq. 1) is formed here with autograd, so a learnable ``beta`` (float, 0-d or ``[H]`` tensor) gets its
gradient from the kernel's per-row ``dL/dtau_r = -sum_j dL/dz_rj``. The RMSNorm on the output is the
module's. Kernels in ``utils/rowwise.py`` (code ``TRA``); TDA's one-pass op (``tda/op.py``) shares ``tra_threshold``.
"""

from __future__ import annotations

import math

import torch

from lengthbench.kernels.defaults import TRA_BETA, TRA_KAPPA, TRA_POWER, TRA_TAU_INDEX
from lengthbench.kernels.utils.rowwise import TRA, rowwise

TAU_INDEX_OFFSET = {"alg1": 0.0, "eq1": 1.0}  # added to n_r inside tau's log


def tau_offset(tau_index: str) -> float:
    if tau_index not in TAU_INDEX_OFFSET:
        raise ValueError(f"tau_index must be one of {', '.join(TAU_INDEX_OFFSET)}, got {tau_index!r}")
    return TAU_INDEX_OFFSET[tau_index]


# tau_base's tensors by (tokens, head dim, kappa, tau_index, device): made once, outside any CUDA graph capture; the
# oldest dropped past MAX_BASES (a sweep of lengths makes one per length)
_BASES: dict[tuple, torch.Tensor] = {}
MAX_BASES = 64


def tau_base(tokens: int, head_dim: int, kappa: float, device, tau_index: str = "alg1") -> torch.Tensor:
    """``[T]`` fp32: ``sqrt(2 * max(0, log((n_r + c) / kappa)) / d)``, the threshold per unit of ``beta``. Kept per
    shape (a training step would otherwise spend eight small kernels a layer making it again); made afresh, and
    not kept, during a CUDA graph capture or under fake tensors (memory neither may keep)."""
    offset = tau_offset(tau_index)
    device = torch.device(device)
    key = (int(tokens), int(head_dim), float(kappa), offset, str(device))
    base = _BASES.get(key)
    if base is not None:
        return base
    n = torch.arange(1, tokens + 1, device=device, dtype=torch.float32)
    base = torch.sqrt(2.0 * torch.clamp(torch.log((n + offset) / kappa), min=0.0) / head_dim)
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if not capturing and torch._guards.detect_fake_mode() is None and not isinstance(
            base, torch._subclasses.FakeTensor):
        if len(_BASES) >= MAX_BASES:
            del _BASES[next(iter(_BASES))]
        _BASES[key] = base
    return base


def tra_threshold(tokens: int, head_dim: int, beta, kappa: float, device, tau_index: str = "alg1") -> torch.Tensor:
    """``tau`` broadcastable to ``[B, H, T]``: ``[T]`` for a float ``beta``, ``[H, T]`` for a per-head one."""
    base = tau_base(tokens, head_dim, kappa, device, tau_index)
    if not torch.is_tensor(beta):
        return float(beta) * base
    beta = beta.to(device, torch.float32)
    return beta[:, None] * base if beta.dim() == 1 else beta * base


def tra_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=1.0, beta=TRA_BETA, kappa=TRA_KAPPA,
                  power=TRA_POWER, tau_index=TRA_TAU_INDEX, tuning: dict | None = None):
    """TRA, ``[B, H, T, D]`` causal; ``q``, ``k`` unit-norm (cosine scores with ``sm_scale=1``); ``tuning``: launch
    settings (``utils.rowwise.launch_settings``)."""
    if sm_scale is None:
        sm_scale = 1.0
    if not math.isfinite(float(power)) or float(power) <= 0:
        raise ValueError(f"tra power must be positive, got {power}")
    tau = tra_threshold(q.shape[-2], q.shape[-1], beta, float(kappa), q.device, tau_index)
    return rowwise(q, k, v, mech=TRA, slopes=slopes, row_scale=row_scale, tau=tau, sm_scale=sm_scale,
                   power=float(power), tuning=tuning)
