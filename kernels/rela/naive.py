"""ReLA attention in plain PyTorch, ``[B, H, T, D]`` causal: the reference the fused op computes (the module's
RMSNorm of each head's output comes after it)."""

import torch


def naive_rela(q, k, v, sm_scale=None):
    """Unnormalised ``ReLU(z_rj)`` weights over ``j <= r``."""
    tokens = q.shape[-2]
    z = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if sm_scale is None else sm_scale)
    seen = torch.ones(tokens, tokens, dtype=torch.bool, device=q.device).tril()
    return torch.where(seen, torch.relu(z), 0.0) @ v


NAIVE = {"rela": naive_rela}
