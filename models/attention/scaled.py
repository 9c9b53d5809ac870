"""Mechanisms that rescale each query row's scores before a base map: SSMax, ASSMax, adaptive temperature.

The entmax and softpick families (``entmax.py``, ``softpick.py``) reuse :class:`RowScaledAttention`: on
CUDA it hands the per-row factor to the base map's fused kernel as ``row_scale`` ``[B, H, T]``.

Length factors. SSMax and scalable-softpick use ``log(n_r)`` as Nakanishi (2025) writes it (row 0 gets
factor 0, harmless: it sees one key). The adaptive family (assmax, sentmax, asentmax) uses
``log(n_r + 1) = log(r + 2)``, as the ASEntmax authors' code does, instead of the paper's ``log n``: with
``log n`` the first row has ``log 1 = 0`` and ``0 ** gamma`` is infinite for a negative ``gamma`` (which
the paper allows and reports, Table 7) and has no gradient in ``gamma``.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from lengthbench.models.attention.base import (
    AttentionLayer,
    as_compute,
    causal_mask,
    per_head,
    per_row,
    row_counts,
    safe_softmax,
)
from lengthbench.models.attention.registry import register_attention
from lengthbench.models.attention.softmax import sdpa_attend

SSMAX_S_INIT = 0.43  # Nakanishi (2025)'s initial s
ASENTMAX_BETA_INIT = math.log(2.0)  # softplus(0): beta of a zero-initialised w_beta
ADATEMP_POLY = (-0.037, 0.481, -2.3, 4.917, -1.791)  # Velickovic et al. (2024), highest degree first


def scale_scores(z: torch.Tensor, factor) -> torch.Tensor:
    """``factor * z`` that keeps ``-inf`` scores ``-inf`` (no ``0 * inf`` NaN, also in the gradient)."""
    finite = torch.isfinite(z)
    return torch.where(finite, torch.where(finite, z, torch.zeros((), dtype=z.dtype, device=z.device)) * factor, z)


def log_length_scale(s, counts: torch.Tensor) -> torch.Tensor:
    """SSMax's factor ``s * log(n_r)``; ``s`` a float or per-head ``[H]`` tensor; ``counts`` ``[Lq, 1]``."""
    return per_head(s, counts) * torch.log(counts)


def adaptive_scale(counts: torch.Tensor, beta, gamma, delta) -> torch.Tensor:
    """``delta + beta * log(n_r + 1) ** gamma``; ``beta``, ``gamma`` floats or per-row ``[..., Lq]``.

    The power is written ``exp(gamma * log(log(n_r + 1)))`` (``log(n_r + 1) >= log 2 > 0``): the same value, but
    ``pow`` with a tensor exponent got a wrong gradient for ``gamma`` from Inductor on CUDA (torch 2.11; tens
    to a hundred times the eager one, session 19, ``benchmarks/compiled_grads.py``), which broke the
    compiled training of ASEntmax and ASSMax models."""
    log_log = torch.log(torch.log(counts + 1))
    return delta + per_row(beta, counts) * torch.exp(per_row(gamma, counts) * log_log)


def ssmax_weights(scores, mask, s=SSMAX_S_INIT, query_positions=None):
    """``softmax(s * log(n_r) * z)``; ``s`` a float or per-head ``[H]`` tensor (default 0.43)."""
    z = as_compute(scores)
    return safe_softmax(scale_scores(z, log_length_scale(s, row_counts(mask, query_positions, z))), mask)


def assmax_weights(scores, mask, beta=ASENTMAX_BETA_INIT, gamma=0.0, delta=1.0, query_positions=None):
    """``softmax((delta + beta_r * log(n_r + 1) ** gamma_r) * z)``; ``beta``, ``gamma`` per row ``[..., Lq]``."""
    z = as_compute(scores)
    return safe_softmax(scale_scores(z, adaptive_scale(row_counts(mask, query_positions, z), beta, gamma, delta)),
                        mask)


def adatemp_weights(scores, mask, query_positions=None):
    """Adaptive temperature (Velickovic et al. 2024): ``softmax(theta * z)``, ``theta = max(1, poly(H))``
    where the entropy ``H`` of ``softmax(z)`` exceeds 0.5, else 1. As in the authors' code, ``H`` uses
    ``log(p + 1e-9)`` and the gradient flows through ``theta``."""
    z = as_compute(scores)
    p = safe_softmax(z, mask)
    entropy = -(p * torch.log(p + 1e-9)).sum(-1, keepdim=True)
    poly = torch.zeros_like(entropy)
    for coefficient in ADATEMP_POLY:
        poly = poly * entropy + coefficient
    theta = torch.where(entropy > 0.5, torch.clamp(poly, min=1.0), torch.ones_like(poly))
    return safe_softmax(scale_scores(z, theta), mask)


SCALED_HEADS = ("all", "nope")


class RowScaledAttention(AttentionLayer):
    """A base map applied to ``row_scale * z``. Subclasses give ``weight_function`` and its ``params``,
    ``base_weights`` (the base map alone), ``row_scale`` (``[B or 1, H, Lq, 1]``) and the name of the base
    map's kernel.

    ``scaled_heads`` says which heads the factor scales. ``"all"`` (the default): every head's scores, an
    ALiBi head's distance bias included. ``"nope"``: only the heads without an ALiBi slope; the ALiBi heads
    keep the base map of their unscaled scores. That is how the seed 003 authors' public code combines its
    scalings with NAPE: it multiplies the queries of the NoPE heads only, and adds the bias after.
    Under RoPE or NoPE no head has a slope and both values give the same model."""

    base_kernel: ClassVar[str] = "softmax"

    def __init__(self, d_model, n_heads, pe, scaled_heads: str = "all", **params):
        super().__init__(d_model, n_heads, pe, **params)
        if scaled_heads not in SCALED_HEADS:
            raise ValueError(f"scaled_heads must be one of {', '.join(SCALED_HEADS)}, got {scaled_heads!r}")
        self.scaled_heads = scaled_heads
        # Which heads keep their unscaled scores, decided once here from plain booleans (a check of the slopes in
        # every forward would sync the GPU and break torch.compile's graph).
        biased = pe.biased_heads()
        self.scales_every_head = scaled_heads == "all" or not any(biased)
        if not self.scales_every_head:
            if all(biased):
                raise ValueError("scaled_heads=nope scales no head under this encoding: every head has an ALiBi slope")
            self.register_buffer("_unscaled", torch.tensor(biased), persistent=False)

    def weight_function(self, scores, mask, query_positions, x_rows):
        raise NotImplementedError

    def base_weights(self, z, mask):
        """The base map of already scaled scores ``z``."""
        raise NotImplementedError

    def head_factor(self, query_positions, x_rows) -> torch.Tensor:
        """``row_scale``, set to 1 on the heads that ``scaled_heads`` leaves alone; ``[B or 1, H, Lq, 1]``."""
        factor = self.row_scale(query_positions, x_rows)
        if self.scales_every_head:
            return factor
        return torch.where(self._unscaled[:, None, None], torch.ones_like(factor), factor)

    def row_scale(self, query_positions: torch.Tensor, x_rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def kernel_params(self) -> dict:
        return {}

    def kernel_supported(self) -> bool:
        return True

    def kernel_names(self) -> tuple[str, ...]:
        return (self.base_kernel,) if self.kernel_supported() else ()

    def weights(self, scores, query_positions, x_rows):
        mask = causal_mask(query_positions, scores.shape[-1])
        if self.scales_every_head:
            return self.weight_function(scores, mask, query_positions, x_rows)
        z = as_compute(scores)
        return self.base_weights(scale_scores(z, self.head_factor(query_positions, x_rows).to(z.dtype)), mask)

    def attend(self, q, k, v, x):
        if not (q.is_cuda and self.use_kernels):
            return self.reference_attend(q, k, v, x)
        batch, heads, tokens, _ = q.shape
        positions = torch.arange(tokens, device=q.device)
        factor = self.head_factor(positions, x)
        if factor.dim() == 4:
            factor = factor.squeeze(-1)
        op = self.kernel(self.base_kernel) if self.kernel_supported() else None
        if op is not None:
            scale = factor.expand(batch, heads, tokens).contiguous()
            return op(q, k, v, slopes=self.pe.slopes(), row_scale=scale, **self.kernel_params())
        if self.base_kernel == "softmax":
            # The row factor scales the queries (and the ALiBi bias): SDPA does the rest. A factor that does not
            # depend on the sample (SSMax's) keeps its batch dimension of 1, and so does the bias.
            return sdpa_attend(q, k, v, self.pe.slopes(), row_scale=factor)
        return self.reference_attend(q, k, v, x)


class LogLengthScaled(RowScaledAttention):
    """``s_h * log(n_r)`` with ``s`` learnable per head (SSMax, scalable-softpick)."""

    def __init__(self, d_model, n_heads, pe, s_init: float = SSMAX_S_INIT, **params):
        super().__init__(d_model, n_heads, pe, **params)
        self.s = nn.Parameter(torch.full((n_heads,), float(s_init)))

    def row_scale(self, query_positions, x_rows):
        counts = (query_positions + 1).to(torch.float32)[:, None]
        return log_length_scale(self.s.float(), counts)[None]


class AdaptiveScaled(RowScaledAttention):
    """``delta + beta_r * log(n_r + 1) ** gamma_r`` with ``beta_r = softplus(x_r . w_beta)`` and
    ``gamma_r = gamma_scale * tanh(x_r . w_gamma)`` per head and query token (ASEntmax, ASSMax).
    The projections start at zero, as in the authors' code: ``beta = log 2``, ``gamma = 0``."""

    def __init__(self, d_model, n_heads, pe, delta: float = 1.0, gamma_scale: float = 1.0, **params):
        super().__init__(d_model, n_heads, pe, **params)
        self.delta = float(delta)
        self.gamma_scale = float(gamma_scale)
        # Parameters, not nn.Linear: the decoder's initialiser would overwrite a zero start.
        self.w_beta = nn.Parameter(torch.zeros(d_model, n_heads))
        self.w_gamma = nn.Parameter(torch.zeros(d_model, n_heads))

    def adaptive_params(self, x_rows):
        """``beta, gamma`` as ``[B, H, Lq]``."""
        x_rows = as_compute(x_rows)
        beta = F.softplus(x_rows @ self.w_beta.to(x_rows.dtype)).transpose(1, 2)
        gamma = self.gamma_scale * torch.tanh(x_rows @ self.w_gamma.to(x_rows.dtype)).transpose(1, 2)
        return beta, gamma

    def row_scale(self, query_positions, x_rows):
        beta, gamma = self.adaptive_params(x_rows)
        counts = (query_positions + 1).to(beta.dtype)[:, None]
        return adaptive_scale(counts, beta, gamma, self.delta)


@register_attention("ssmax", weights=ssmax_weights)
class SSMaxAttention(LogLengthScaled):
    """Scalable-Softmax (Nakanishi 2025): softmax(s * log(n_r) * z), s learnable per head."""

    def weight_function(self, scores, mask, query_positions, x_rows):
        return ssmax_weights(scores, mask, s=self.s, query_positions=query_positions)

    def base_weights(self, z, mask):
        return safe_softmax(z, mask)


@register_attention("assmax", weights=assmax_weights)
class ASSMaxAttention(AdaptiveScaled):
    """Adaptive-scalable softmax (seed 003): ASEntmax's per-token scaling applied to softmax."""

    def weight_function(self, scores, mask, query_positions, x_rows):
        beta, gamma = self.adaptive_params(x_rows)
        return assmax_weights(scores, mask, beta=beta, gamma=gamma, delta=self.delta, query_positions=query_positions)

    def base_weights(self, z, mask):
        return safe_softmax(z, mask)


@register_attention("adatemp", weights=adatemp_weights)
class AdaptiveTemperatureAttention(AttentionLayer):
    """Adaptive temperature softmax (Velickovic et al. 2024): sharpen rows whose entropy exceeds 0.5."""

    def weights(self, scores, query_positions, x_rows):
        return adatemp_weights(scores, causal_mask(query_positions, scores.shape[-1]), query_positions)

    def attend(self, q, k, v, x):
        op = self.kernel() if q.is_cuda else None
        if op is not None:
            return op(q, k, v, slopes=self.pe.slopes())
        return self.reference_attend(q, k, v, x)
