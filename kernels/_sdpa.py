"""Causal softmax attention through torch SDPA, with an optional ALiBi bias and per-row score factor.

Not a Triton op: softmax, gated and diffsoftmax use it directly, the row-scaled softmax mechanisms (ssmax,
assmax) and adatemp through their factor (adatemp's temperature is here too: torch only). Scores:
``z = row_scale_r * (q.k * scale - slope_h * (r - j))``.
Without a bias the factor goes into the queries and SDPA's flash backend does the rest (O(L) memory); with
one, the bias (times the factor) is an explicit mask, ``SDPA_BIAS_CHUNK`` query rows per call (O(chunk x L)).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Query rows per SDPA call when a distance bias forces an explicit mask: O(chunk x L) memory.
SDPA_BIAS_CHUNK = 2048

# adatemp's theta = poly(H) by Horner's rule, highest power first (Velickovic et al.'s coefficients).
ADATEMP_POLY = (-0.037, 0.481, -2.3, 4.917, -1.791)


def temperature(entropy: torch.Tensor) -> torch.Tensor:
    """adatemp's ``theta = max(1, poly(H))`` where ``H > 0.5``, else 1 (``kernels/adatemp.py``)."""
    poly = torch.zeros_like(entropy)
    for coefficient in ADATEMP_POLY:
        poly = poly * entropy + coefficient
    return torch.where(entropy > 0.5, torch.clamp(poly, min=1.0), torch.ones_like(poly))


def sdpa_attend(q, k, v, slopes: torch.Tensor | None, scale: float | None = None,
                row_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, H, T, D]`` causal softmax attention; ``slopes`` ``[H]`` or None, ``row_scale`` ``[B, H, T]`` or
    broadcastable to it (``[1, H, T]``, ``[H, T]``) or None. Gradients flow to q, k, v and ``row_scale``."""
    if row_scale is not None:
        # Kept unexpanded for the bias: a factor shared by every sample gives a bias of batch 1, broadcast by
        # SDPA, instead of one bias per sample (B times the memory traffic).
        row_scale = row_scale.reshape((1,) * (3 - row_scale.dim()) + tuple(row_scale.shape))
        q = q * row_scale[..., None].to(q.dtype)
    if slopes is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    tokens = q.shape[-2]
    outputs = []
    for start in range(0, tokens, SDPA_BIAS_CHUNK):
        stop = min(tokens, start + SDPA_BIAS_CHUNK)
        positions = torch.arange(start, stop, device=q.device)
        distance = (positions[:, None] - torch.arange(stop, device=q.device)[None, :]).to(q.dtype)
        bias = -slopes.to(q.dtype)[:, None, None] * distance
        if row_scale is not None:
            bias = bias * row_scale[:, :, start:stop, None].to(q.dtype)  # [B or 1, H or 1, chunk, stop]
        else:
            bias = bias.unsqueeze(0)
        bias = bias.masked_fill(distance < 0, float("-inf"))
        outputs.append(F.scaled_dot_product_attention(q[:, :, start:stop], k[:, :, :stop], v[:, :, :stop],
                                                      attn_mask=bias, scale=scale))
    return torch.cat(outputs, dim=2)
