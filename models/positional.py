"""Positional encodings: RoPE (Llama-3 scaled), NoPE, ALiBi and NAPE.

An encoding acts in one or both of two places, so that a fused kernel can apply it too:
``rotate`` turns queries and keys (RoPE), and ``slopes`` gives a per-head linear distance bias
``- slope_h * (r - j)`` added to the raw score of query ``r`` and key ``j`` (ALiBi, NAPE; 0 = none).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from lengthbench.models.registry import Registry

POSITIONAL_ENCODINGS: Registry[type[PositionalEncoding]] = Registry("positional encoding")
register_pe = POSITIONAL_ENCODINGS.register


class PositionalEncoding(nn.Module):
    """No positional information (NoPE); the base of the others."""

    def __init__(self, n_heads: int, head_dim: int, **params):
        super().__init__()
        if params:
            raise ValueError(f"positional encoding {type(self).__name__} takes no parameter {sorted(params)[0]!r}")
        self.n_heads = n_heads
        self.head_dim = head_dim

    def rotate(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
        return q, k

    def slopes(self) -> torch.Tensor | None:
        """Per-head ALiBi slopes ``[n_heads]`` (0 for heads without bias), or None if no head has one."""
        return None

    def biased_heads(self) -> tuple[bool, ...]:
        """Which heads have an ALiBi slope, as plain booleans: known without reading a tensor, so also for a
        model built on the meta device. Read from ``slopes()`` where an encoding does not say."""
        slopes = self.slopes()
        if slopes is None or slopes.is_meta:
            return (False,) * self.n_heads
        return tuple(bool(b) for b in (slopes != 0).tolist())


register_pe("none", aliases=("nope",))(PositionalEncoding)


def llama3_inverse_frequencies(
    head_dim: int,
    base: float = 10_000.0,
    factor: float = 16.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    original_context: int = 8192,
) -> torch.Tensor:
    """RoPE inverse frequencies with Llama 3's frequency-dependent scaling.

    Wavelengths shorter than ``original_context / high_freq_factor`` are kept, those longer than
    ``original_context / low_freq_factor`` are divided by ``factor``, and the band between is
    interpolated smoothly (the rule of Hugging Face's ``rope_type="llama3"``, the papers' setting).
    """
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if factor == 1.0:
        return inv_freq.float()
    wavelength = 2 * math.pi / inv_freq
    low_freq_wavelength = original_context / low_freq_factor
    high_freq_wavelength = original_context / high_freq_factor
    smooth = (original_context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    interpolated = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelength > low_freq_wavelength, inv_freq / factor, inv_freq)
    between = (wavelength >= high_freq_wavelength) & (wavelength <= low_freq_wavelength)
    return torch.where(between, interpolated, scaled).float()


@register_pe("rope")
class RoPE(PositionalEncoding):
    """Rotary embeddings, base 10,000, Llama-3 scaling with factor 16 (the RoPE of Long-Context Generalization with
    Sparse Attention and of Sieve Attention)."""

    def __init__(self, n_heads: int, head_dim: int, base: float = 10_000.0, factor: float = 16.0,
                 low_freq_factor: float = 1.0, high_freq_factor: float = 4.0, original_context: int = 8192):
        super().__init__(n_heads, head_dim)
        if head_dim % 2:
            raise ValueError(f"rope needs an even head dimension, got {head_dim}")
        inv_freq = llama3_inverse_frequencies(head_dim, base, factor, low_freq_factor, high_freq_factor,
                                              original_context)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def rotate(self, q, k, positions):
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]  # [T, D/2]
        cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(q.dtype)
        sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(q.dtype)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """The geometric slopes of Press et al. (2022), with their rule for head counts not a power of 2."""

    def power_of_two_slopes(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    if n_heads & (n_heads - 1) == 0:
        slopes = power_of_two_slopes(n_heads)
    else:
        closest = 2 ** math.floor(math.log2(n_heads))
        slopes = power_of_two_slopes(closest) + power_of_two_slopes(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


@register_pe("alibi")
class ALiBi(PositionalEncoding):
    """ALiBi (Press et al. 2022): every head adds a linear distance penalty, its slope from the geometric series."""

    def __init__(self, n_heads: int, head_dim: int):
        super().__init__(n_heads, head_dim)
        self.register_buffer("_slopes", alibi_slopes(n_heads), persistent=False)

    def slopes(self):
        return self._slopes

    def biased_heads(self):
        return (True,) * self.n_heads  # every geometric slope is positive


@register_pe("nape")
class NAPE(PositionalEncoding):
    """NoPE + ALiBi (Long-Context Generalization with Sparse Attention): the last ``n_heads // 2`` heads are ALiBi
    with slope ``1 / h`` for the h-th ALiBi head (h = 1, 2, ...), the others have no positional encoding (one head:
    NoPE)."""

    def __init__(self, n_heads: int, head_dim: int):
        super().__init__(n_heads, head_dim)
        n_alibi = n_heads // 2
        slopes = torch.zeros(n_heads)
        slopes[n_heads - n_alibi :] = 1.0 / torch.arange(1, n_alibi + 1, dtype=torch.float32)
        self.register_buffer("_slopes", slopes, persistent=False)
        self.n_alibi = n_alibi

    def slopes(self):
        return self._slopes

    def biased_heads(self):
        return (False,) * (self.n_heads - self.n_alibi) + (True,) * self.n_alibi


def build_pe(name: str, n_heads: int, head_dim: int, **params) -> PositionalEncoding:
    return POSITIONAL_ENCODINGS.get(name)(n_heads, head_dim, **params)
