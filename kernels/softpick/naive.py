"""Softpick attention in plain PyTorch, ``[B, H, T, D]`` causal: the reference the fused op computes."""

import torch


def naive_softpick(q, k, v, sm_scale=None, eps=1e-6):
    """``w_rj = ReLU(e^z_rj - 1) / (sum_{j<=r} |e^z_rj - 1| + eps)``: rectified, not summing to one."""
    tokens = q.shape[-2]
    z = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if sm_scale is None else sm_scale)
    seen = torch.ones(tokens, tokens, dtype=torch.bool, device=q.device).tril()
    shifted = torch.where(seen, torch.expm1(z), 0.0)
    return torch.relu(shifted) / (shifted.abs().sum(-1, keepdim=True) + eps) @ v


NAIVE = {"softpick": naive_softpick}
