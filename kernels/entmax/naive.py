"""alpha-entmax attention in plain PyTorch, ``[B, H, T, D]`` causal: the reference the fused ops compute."""

import torch


def naive_entmax(q, k, v, sm_scale=None, alpha=1.5):
    """``p_rj = ((alpha - 1) z_rj - tau_r)_+^(1 / (alpha - 1))`` over ``j <= r``, ``tau_r`` such that the row sums
    to one (by bisection); alpha 2 is sparsemax."""
    tokens = q.shape[-2]
    z = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if sm_scale is None else sm_scale)
    seen = torch.ones(tokens, tokens, dtype=torch.bool, device=q.device).tril()
    x = torch.where(seen, (alpha - 1) * z, float("-inf"))
    top = x.amax(-1, keepdim=True)
    low, high = top - 1, top
    for _ in range(100):
        tau = (low + high) / 2
        above = (torch.clamp(x - tau, min=0) ** (1 / (alpha - 1))).sum(-1, keepdim=True) > 1
        low, high = torch.where(above, tau, low), torch.where(above, high, tau)
    p = torch.clamp(x - low, min=0) ** (1 / (alpha - 1))
    return p / p.sum(-1, keepdim=True) @ v


def naive_sparsemax(q, k, v, sm_scale=None):
    return naive_entmax(q, k, v, sm_scale, alpha=2.0)


NAIVE = {"entmax": naive_entmax, "sparsemax": naive_sparsemax}
