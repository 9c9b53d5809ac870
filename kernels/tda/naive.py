"""Threshold Differential Attention in plain PyTorch, ``[B, H, T, D]`` causal, on two views of unit queries and keys:
the reference the fused op computes."""

import torch


def _tra(q, k, beta, kappa, power):
    """TRA's weights ``(s_rj - tau_r)_+^power`` over ``j <= r``, ``tau_r = beta sqrt(2 max(0, log(n_r / kappa)) /
    d)``."""
    tokens, dim = q.shape[-2], q.shape[-1]
    s = q @ k.transpose(-1, -2)
    seen = torch.ones(tokens, tokens, dtype=torch.bool, device=q.device).tril()
    counts = torch.arange(1, tokens + 1, device=q.device, dtype=s.dtype)[:, None]
    tau = beta * torch.sqrt(2 * torch.clamp(torch.log(counts / kappa), min=0) / dim)
    return torch.where(seen, torch.relu(s - tau) ** power, 0.0)


def naive_tda(q1, k1, q2, k2, v, lam=0.5, beta=1.0, kappa=1.0, power=2.0):
    """``(tra(q1, k1) - lam tra(q2, k2)) v``: the excitatory view less ``lam`` times the inhibitory one."""
    return (_tra(q1, k1, beta, kappa, power) - lam * _tra(q2, k2, beta, kappa, power)) @ v


NAIVE = {"tda": naive_tda}
