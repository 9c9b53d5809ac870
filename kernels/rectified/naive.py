"""Rectified softmax attention in plain PyTorch, ``[B, H, T, D]`` causal: the reference the fused op computes."""

import torch


def naive_rectified(q, k, v, sm_scale=None):
    """Softmax over the keys ``j <= r`` with ``z_rj >= 0``; a row with none outputs zero."""
    tokens = q.shape[-2]
    z = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if sm_scale is None else sm_scale)
    kept = torch.ones(tokens, tokens, dtype=torch.bool, device=q.device).tril() & (z >= 0)
    e = torch.where(kept, torch.exp(z - torch.where(kept, z, float("-inf")).amax(-1, keepdim=True)), 0.0)
    total = e.sum(-1, keepdim=True)
    return torch.where(total > 0, e / torch.where(total > 0, total, 1.0), 0.0) @ v


NAIVE = {"rectified": naive_rectified}
