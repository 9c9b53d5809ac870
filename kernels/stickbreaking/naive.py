"""Stick-breaking attention in plain PyTorch, ``[B, H, T, D]`` causal: the reference the fused op computes."""

import torch
import torch.nn.functional as F


def naive_stickbreaking(q, k, v, sm_scale=None):
    """``o_r = sum_{j<r} a_rj v_j + (1 - sum_j a_rj) v_r`` with ``a_rj = sigmoid(z_rj) prod_{j<k<r} (1 -
    sigmoid(z_rk))``: ``log a_rj = z_rj - sum_{j<=k<r} softplus(z_rk)``."""
    tokens = q.shape[-2]
    scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    z = q @ k.transpose(-1, -2) * scale
    earlier = torch.ones(tokens, tokens, dtype=torch.bool, device=q.device).tril(-1)
    softplus = torch.where(earlier, F.softplus(z), 0.0)  # -log(1 - sigmoid z)
    from_j = softplus.flip(-1).cumsum(-1).flip(-1)  # sum over k >= j (of the keys before the row)
    weights = torch.where(earlier, torch.exp(z - from_j), 0.0)
    remainder = torch.exp(-softplus.sum(-1, keepdim=True))
    return weights @ v + remainder * v


NAIVE = {"stickbreaking": naive_stickbreaking}
