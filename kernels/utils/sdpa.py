"""Causal softmax attention through torch SDPA, with an optional ALiBi bias and per-row score factor.

Not a Triton op: softmax, gated and diffsoftmax use it directly, the row-scaled softmax mechanisms (ssmax,
assmax) and adatemp through their factor (adatemp's temperature is here too: torch only). Scores:
``z = row_scale_r * (q.k * scale - slope_h * (r - j))``.
Without a bias the factor goes into the queries and SDPA's flash backend does the rest (O(L) memory). With one,
the row's own term ``-row_scale_r * slope_h * r`` is the same for every key of the row and leaves the softmax
unchanged, so what is left, ``row_scale_r * slope_h * j``, is a product of a query's factor and a key's position:
a few extra head channels of the queries and keys (``alibi_channels``), and SDPA's flash backend again
(for 16-bit inputs: ``alibi_as_channels`` says when). Otherwise the bias goes to SDPA as an explicit mask,
``SDPA_BIAS_CHUNK`` query rows per call (O(chunk x L) memory). On CUDA, the calls without a mask take torch's own
choice of backend.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Query rows per SDPA call when the ALiBi bias is an explicit mask: O(chunk x L) memory.
SDPA_BIAS_CHUNK = 2048

# Key positions as parts that a 16-bit float holds exactly (8 significant bits each): j = 65536 a + 256 b + c.
POSITION_PART = 256

# adatemp's theta = poly(H) by Horner's rule, highest power first (Velickovic et al.'s coefficients).
ADATEMP_POLY = (-0.037, 0.481, -2.3, 4.917, -1.791)


def temperature(entropy: torch.Tensor) -> torch.Tensor:
    """adatemp's ``theta = max(1, poly(H))`` where ``H > 0.5``, else 1 (``kernels/adatemp/op.py``)."""
    poly = torch.zeros_like(entropy)
    for coefficient in ADATEMP_POLY:
        poly = poly * entropy + coefficient
    return torch.where(entropy > 0.5, torch.clamp(poly, min=1.0), torch.ones_like(poly))


def position_parts(tokens: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """``[parts, tokens]``: key positions ``j`` split so that every part is exact in ``dtype`` and the parts sum to
    ``j`` (one part in float32 and wider; in 16-bit floats, base-256 digits times their place value)."""
    positions = torch.arange(tokens, device=device)
    if torch.finfo(dtype).bits >= 32 or tokens <= POSITION_PART:
        return positions[None].to(dtype)
    parts, place = [], 1
    while place < tokens:
        parts.append((positions // place % POSITION_PART) * place)
        place *= POSITION_PART
    return torch.stack(parts).to(dtype)


class _FactorChannels(torch.autograd.Function):
    """The queries' extra channels: the row factor ``t_r`` as a high and a low part in a 16-bit dtype, each
    ``n`` times (once per position part of the keys), then a zero channel whose key is 1.

    Backward: SDPA gives each channel ``scale * sum_j dS_rj * key_j``; ``dt_r = scale * sum_j dS_rj * j`` is the
    sum over one part's channels. Exactly ``sum_j dS_rj = 0``, but SDPA's ``dS`` is rounded to 16 bits, and ``r``
    times its rounded sum would swamp a row's true gradient; the zero channel's gradient is that sum, so
    ``dt_r = scale * sum_j dS_rj * (j - r)``, with an error in proportion to the gradient itself."""

    @staticmethod
    def forward(ctx, factor, parts: int, dtype):
        high = factor.to(dtype)
        low = (factor - high.to(factor.dtype)).to(dtype)
        ctx.parts, ctx.factor_dtype = parts, factor.dtype
        return torch.stack([high] * parts + [low] * parts + [torch.zeros_like(high)], -1)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.to(ctx.factor_dtype)
        rows = torch.arange(grad.shape[-2], device=grad.device, dtype=ctx.factor_dtype)
        return (grad[..., :ctx.parts].sum(-1) - rows * grad[..., -1]).to(ctx.factor_dtype), None, None


def alibi_channels(q, k, slopes: torch.Tensor, scale: float, row_scale: torch.Tensor | None):
    """``(q', k')``: 16-bit q and k with extra head channels (zero-padded to a multiple of 8) whose dot product
    is ``row_scale_r * slope_h * j / scale``: the query's factor as a high and a low part (:class:`_FactorChannels`),
    the key's position as :func:`position_parts`, each product exact, added up in SDPA's float32 accumulator (a
    bfloat16 mask rounds the distance itself to 8 significant bits)."""
    batch, heads, tokens, dim = q.shape
    wide = torch.promote_types(q.dtype, torch.float32)  # float64 where a test gives float64
    factor = (slopes.to(wide) / scale)[:, None].expand(heads, tokens)  # [H, T]
    if row_scale is not None:
        factor = factor * row_scale.to(wide)  # [B or 1, H, T]
    parts = position_parts(tokens, q.dtype, q.device)
    q_extra = _FactorChannels.apply(factor.expand(batch, heads, tokens), parts.shape[0], q.dtype)
    k_extra = torch.cat([parts, parts, parts.new_ones(1, tokens)]).T.expand(k.shape[0], heads, tokens, -1)
    pad = -(dim + q_extra.shape[-1]) % 8
    q_new = torch.cat([q, q_extra, q.new_zeros(batch, heads, tokens, pad)], -1)
    k_new = torch.cat([k, k_extra, k.new_zeros(k.shape[0], heads, tokens, pad)], -1)
    return q_new, k_new


def alibi_as_channels(q, slopes: torch.Tensor, row_scale: torch.Tensor | None) -> bool:
    """Whether :func:`sdpa_attend` takes the bias as channels: 16-bit inputs (float32 SDPA
    may multiply in TF32, which would round the factor), positions that a 16-bit float's parts hold (float16:
    65,536), and, where the row factor or the slopes want a gradient, rows of at most 256 keys (one position part:
    the zero channel's correction needs every part's gradient in one channel)."""
    if q.dtype not in (torch.bfloat16, torch.float16):
        return False
    tokens = q.shape[-2]
    if q.dtype == torch.float16 and tokens > 65_536:
        return False
    wants_grad = torch.is_grad_enabled() and (slopes.requires_grad or (row_scale is not None
                                                                      and row_scale.requires_grad))
    return tokens <= POSITION_PART or not wants_grad


def sdpa_attend(q, k, v, slopes: torch.Tensor | None, scale: float | None = None,
                row_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, H, T, D]`` causal softmax attention; ``slopes`` ``[H]`` or None, ``row_scale`` ``[B, H, T]`` or
    broadcastable to it (``[1, H, T]``, ``[H, T]``) or None. Gradients flow to q, k, v and ``row_scale``."""
    if row_scale is not None:
        # Kept unexpanded for the bias: a factor shared by every sample gives a bias of batch 1, broadcast by
        # SDPA, instead of one bias per sample (B times the memory traffic).
        row_scale = row_scale.reshape((1,) * (3 - row_scale.dim()) + tuple(row_scale.shape))
        q_scaled = q * row_scale[..., None].to(q.dtype)
    else:
        q_scaled = q
    if slopes is None:
        return _causal(q_scaled, k, v, scale)
    if alibi_as_channels(q, slopes, row_scale):
        return _channels(q_scaled, k, v, slopes, scale, row_scale)
    return _masked(q_scaled, k, v, slopes, scale, row_scale)


def _channels(q, k, v, slopes, scale, row_scale):
    """The ALiBi bias as channels of q and k (:func:`alibi_channels`), one SDPA call (flash attention)."""
    dim = q.shape[-1]
    scale = dim ** -0.5 if scale is None else float(scale)
    q_new, k_new = alibi_channels(q, k, slopes, scale, row_scale)
    # flash attention wants one head width for q, k and v (diffsoftmax's v is twice as wide as its q)
    width = max(q_new.shape[-1], v.shape[-1])
    q_new, k_new = (F.pad(t, (0, width - t.shape[-1])) for t in (q_new, k_new))
    out = _causal(q_new, k_new, F.pad(v, (0, width - v.shape[-1])), scale)
    return out[..., :v.shape[-1]]


def _causal(q, k, v, scale):
    """Causal SDPA without a mask."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)


def _masked(q, k, v, slopes, scale, row_scale):
    """The ALiBi bias as an explicit mask, ``SDPA_BIAS_CHUNK`` query rows per SDPA call."""
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
