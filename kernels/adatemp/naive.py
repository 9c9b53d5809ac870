"""Adaptive-temperature softmax attention in plain PyTorch, ``[B, H, T, D]`` causal: the reference the fused op
computes."""

import torch

from lengthbench.kernels.utils.sdpa import ADATEMP_POLY


def naive_adatemp(q, k, v, sm_scale=None):
    """``softmax(theta_r z_r)``, ``theta_r = max(1, poly(H_r))`` where the entropy ``H_r`` of ``softmax(z_r)`` (over
    ``j <= r``) exceeds 0.5, else 1."""
    tokens = q.shape[-2]
    z = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if sm_scale is None else sm_scale)
    z = z.masked_fill(~torch.ones(tokens, tokens, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    p = torch.softmax(z, -1)
    entropy = -(p * torch.log(torch.where(p > 0, p, 1.0))).sum(-1, keepdim=True)
    poly = torch.zeros_like(entropy)
    for coefficient in ADATEMP_POLY:
        poly = poly * entropy + coefficient
    theta = torch.where(entropy > 0.5, poly.clamp_min(1.0), 1.0)
    return torch.softmax(theta * z, -1) @ v


NAIVE = {"adatemp": naive_adatemp}
