"""Threshold-rectified attention (TRA) in plain PyTorch, ``[B, H, T, D]`` causal, on unit queries and keys (cosine
scores, as the module hands them to the fused op): the reference the op computes."""

import torch


def naive_tra(q, k, v, beta=1.0, kappa=1.0, power=2.0):
    """``w_rj = (s_rj - tau_r)_+^power`` over ``j <= r``, unnormalised, with ``tau_r = beta sqrt(2 max(0, log(n_r /
    kappa)) / d)`` and ``n_r = r + 1`` the keys the row sees."""
    tokens, dim = q.shape[-2], q.shape[-1]
    s = q @ k.transpose(-1, -2)
    seen = torch.ones(tokens, tokens, dtype=torch.bool, device=q.device).tril()
    counts = torch.arange(1, tokens + 1, device=q.device, dtype=s.dtype)[:, None]
    tau = beta * torch.sqrt(2 * torch.clamp(torch.log(counts / kappa), min=0) / dim)
    return torch.where(seen, torch.relu(s - tau) ** power, 0.0) @ v


NAIVE = {"tra": naive_tra}
