"""Sieve attention in plain PyTorch, ``[B, H, T, D]`` causal: its Section 3 form (stick-breaking over the support of
1.5-entmax of the earlier keys' scores) and its Algorithm 1 window (``sieve-window``)."""

import torch
import torch.nn.functional as F

from lengthbench.kernels.defaults import SIEVE_REMAINDER


def _stick(z, active, v, remainder="diagonal"):
    """Stick-breaking over the ``active`` keys, the remainder on the query's own value (``"drop"``: nowhere)."""
    softplus = torch.where(active, F.softplus(z), 0.0)
    weights = torch.where(active, torch.exp(z - softplus.flip(-1).cumsum(-1).flip(-1)), 0.0)
    rest = torch.exp(-softplus.sum(-1, keepdim=True)) * v
    return weights, rest if remainder == "diagonal" else torch.zeros_like(rest)


def naive_sieve(q, k, v, sm_scale=None, remainder=SIEVE_REMAINDER):
    """The stick broken over ``{j < r : z_rj / 2 > tau_r}``, ``tau_r`` the 1.5-entmax threshold of ``z_r / 2`` over
    ``j < r`` (``sum_j (z_rj / 2 - tau_r)_+^2 = 1``, by bisection); what is left of the stick on ``v_r``
    (``remainder="diagonal"``) or nowhere (``"drop"``, Eq. 7)."""
    tokens = q.shape[-2]
    z = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if sm_scale is None else sm_scale)
    earlier = torch.ones(tokens, tokens, dtype=torch.bool, device=q.device).tril(-1)
    x = torch.where(earlier, z / 2, float("-inf"))
    top = x.amax(-1, keepdim=True).clamp_min(-1e30)
    low, high = top - 1, top
    for _ in range(100):
        tau = (low + high) / 2
        above = (torch.clamp(x - tau, min=0) ** 2).sum(-1, keepdim=True) > 1
        low, high = torch.where(above, tau, low), torch.where(above, high, tau)
    weights, rest = _stick(z, earlier & (x > low), v, remainder)
    return weights @ v + rest


def naive_sieve_window(q, k, v, sm_scale=None, eps=2.0):
    """The stick broken over every ``j < r``, the weights kept where ``z_rj >= max_{k<r} z_rk - eps``."""
    tokens = q.shape[-2]
    z = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if sm_scale is None else sm_scale)
    earlier = torch.ones(tokens, tokens, dtype=torch.bool, device=q.device).tril(-1)
    top = torch.where(earlier, z, float("-inf")).amax(-1, keepdim=True)
    weights, rest = _stick(z, earlier, v)
    return torch.where(z >= top - eps, weights, 0.0) @ v + rest


NAIVE = {"sieve": naive_sieve, "sieve-window": naive_sieve_window}
