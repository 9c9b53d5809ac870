"""Mechanisms that rescale each query row's scores before a base map: SSMax, ASSMax, adaptive temperature.

The entmax and softpick families (``entmax.py``, ``softpick.py``) reuse :class:`RowScaledAttention`: on
CUDA it hands the per-row factor to the base map's fused kernel as ``row_scale`` ``[B, H, T]``.

Defaults follow the code of "Long-Context Generalization with Sparse Attention" (deep-spin/asentmax
``synthetic/src/models/architectures/sparse_gemma.py``) where its text is silent; the other forms stay
parameter values:

- the length term ``log(n_r + 1) = log(r + 2)`` (its ``log_position``, "offset by 2") for SSMax, ASSMax, SEntmax
  and ASEntmax, not the ``log n`` of the text: with ``log n`` the first row has ``log 1 = 0``, and ``0 ** gamma``
  is infinite for a negative ``gamma`` (which the paper allows and reports, Table 7). SSMax's ``log_offset=0``
  gives Nakanishi (2025)'s ``log(n_r)``; scalable-softpick keeps that one (Softpick's form);
- SSMax's ``s`` starts at 1 (its ``"nakanishi"`` scale: ``normal(1.0, 0.01)``); ``s_init=0.43`` is Nakanishi's;
- under NAPE only the NoPE heads are scaled (``scaled_heads="nope"``, its ``num_scaled_heads``) for SSMax, ASSMax
  and ASEntmax; ``"all"`` scales every head, an ALiBi head's bias included;
- ASEntmax's and ASSMax's ``gamma`` range is 2 (``attn_scale_gamma_range``); ``gamma_scale=1`` the narrower one.
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

SSMAX_S_INIT = 0.43  # Nakanishi (2025)'s initial s (scalable-softpick's; SSMax's with s_init=0.43)
SSMAX_S_INIT_AUTHORS = 1.0  # the sparse-attention authors' initial s: SSMax's default
SSMAX_LOG_OFFSET = 1  # SSMax's length term log(n_r + 1) = log(r + 2), as the sparse-attention authors' code
ADAPTIVE_GAMMA_SCALE = 2.0  # gamma's range in the sparse-attention authors' code (attn_scale_gamma_range)
ASENTMAX_BETA_INIT = math.log(2.0)  # softplus(0): beta of a zero-initialised w_beta
ADATEMP_POLY = (-0.037, 0.481, -2.3, 4.917, -1.791)  # Velickovic et al. (2024), highest degree first


def scale_scores(z: torch.Tensor, factor) -> torch.Tensor:
    """``factor * z`` that keeps ``-inf`` scores ``-inf`` (no ``0 * inf`` NaN, also in the gradient)."""
    finite = torch.isfinite(z)
    return torch.where(finite, torch.where(finite, z, torch.zeros((), dtype=z.dtype, device=z.device)) * factor, z)


def log_length_scale(s, counts: torch.Tensor, log_offset: int = 0) -> torch.Tensor:
    """The factor ``s * log(n_r + log_offset)``; ``s`` a float or per-head ``[H]`` tensor; ``counts`` ``[Lq, 1]``."""
    return per_head(s, counts) * torch.log(counts + log_offset)


def adaptive_scale(counts: torch.Tensor, beta, gamma, delta) -> torch.Tensor:
    """``delta + beta * log(n_r + 1) ** gamma``; ``beta``, ``gamma`` floats or per-row ``[..., Lq]``.

    The power is written ``exp(gamma * log(log(n_r + 1)))`` (``log(n_r + 1) >= log 2 > 0``): the same value, but
    ``pow`` with a tensor exponent got a wrong gradient for ``gamma`` from Inductor on CUDA (torch 2.11; tens
    to a hundred times the eager one), which broke the compiled training of ASEntmax and ASSMax models."""
    log_log = torch.log(torch.log(counts + 1))
    return delta + per_row(beta, counts) * torch.exp(per_row(gamma, counts) * log_log)


def ssmax_weights(scores, mask, s=SSMAX_S_INIT_AUTHORS, query_positions=None, log_offset=SSMAX_LOG_OFFSET):
    """``softmax(s * log(n_r + log_offset) * z)``; ``s`` a float or per-head ``[H]`` tensor (default 1),
    ``log_offset`` 1 (0: Nakanishi's ``log(n_r)``)."""
    z = as_compute(scores)
    factor = log_length_scale(s, row_counts(mask, query_positions, z), log_offset)
    return safe_softmax(scale_scores(z, factor), mask)


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

    ``scaled_heads`` says which heads the factor scales. ``"all"``: every head's scores, an ALiBi head's
    distance bias included. ``"nope"``: under an encoding that mixes ALiBi and NoPE heads (NAPE), only the heads
    without a slope; the ALiBi heads keep the base map of their unscaled scores. That is how the code of
    "Long-Context Generalization with Sparse Attention" combines its scalings with NAPE (``sparse_gemma.py``: it
    multiplies the queries of the NoPE heads only, and adds the bias after), and it scales every head without
    NAPE; so ``"nope"`` scales every head where all heads or none have a slope, and both values give the same
    model there. The default is ``"all"`` here, ``"nope"`` for SSMax, ASSMax and ASEntmax."""

    base_kernel: ClassVar[str] = "softmax"

    def __init__(self, d_model, n_heads, pe, scaled_heads: str = "all", **params):
        super().__init__(d_model, n_heads, pe, **params)
        if scaled_heads not in SCALED_HEADS:
            raise ValueError(f"scaled_heads must be one of {', '.join(SCALED_HEADS)}, got {scaled_heads!r}")
        self.scaled_heads = scaled_heads
        # Which heads keep their unscaled scores, decided once here from plain booleans (a check of the slopes in
        # every forward would sync the GPU and break torch.compile's graph).
        biased = pe.biased_heads()
        self.scales_every_head = scaled_heads == "all" or not any(biased) or all(biased)
        if not self.scales_every_head:
            self.register_buffer("_unscaled", torch.tensor(biased), persistent=False)

    def weight_function(self, scores, mask, query_positions, x_rows):
        raise NotImplementedError

    def base_weights(self, z, mask):
        """The base map of already scaled scores ``z``."""
        raise NotImplementedError

    def head_factor(self, query_positions, x_rows) -> torch.Tensor:
        """``row_scale``, set to 1 on the heads that ``scaled_heads`` leaves alone; ``[B or 1, H, Lq, 1]``."""
        return self.keep_unscaled(self.row_scale(query_positions, x_rows))

    def keep_unscaled(self, factor: torch.Tensor) -> torch.Tensor:
        """``factor`` ``[B or 1, H, Lq, 1]`` set to 1 on the heads that ``scaled_heads`` leaves alone."""
        if self.scales_every_head:
            return factor
        return torch.where(self._unscaled[:, None, None], torch.ones_like(factor), factor)

    def row_scale(self, query_positions: torch.Tensor, x_rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def kernel_params(self) -> dict:
        return {}

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
        positions = torch.arange(q.shape[-2], device=q.device)
        return self.attend_scaled(q, k, v, self.head_factor(positions, x), x)

    def attend_scaled(self, q, k, v, factor, x):
        """The per-head outputs on CUDA, given the factor (``head_factor``'s): the base map's fused op, SDPA for
        softmax, else the reference."""
        batch, heads, tokens, _ = q.shape
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
    """``s_h * log(n_r + log_offset)`` with ``s`` learnable per head (SSMax, scalable-softpick)."""

    log_offset: int = 0

    def __init__(self, d_model, n_heads, pe, s_init: float = SSMAX_S_INIT, **params):
        super().__init__(d_model, n_heads, pe, **params)
        self.s = nn.Parameter(torch.full((n_heads,), float(s_init)))

    def row_scale(self, query_positions, x_rows):
        dtype = torch.promote_types(self.s.dtype, torch.float32)  # float64 stays float64 (gradcheck)
        counts = (query_positions + 1).to(dtype)[:, None]
        return log_length_scale(self.s.to(dtype), counts, self.log_offset)[None]


class AdaptiveScaled(RowScaledAttention):
    """``delta + beta_r * log(n_r + 1) ** gamma_r`` with ``beta_r = softplus(x_r . w_beta)`` and
    ``gamma_r = gamma_scale * tanh(x_r . w_gamma)`` per head and query token (ASEntmax, ASSMax).
    The projections start at zero: ``beta = log 2``, ``gamma = 0``. ``gamma_scale`` 2 and ``scaled_heads="nope"``
    by default, as the sparse-attention authors' code."""

    def __init__(self, d_model, n_heads, pe, delta: float = 1.0, gamma_scale: float = ADAPTIVE_GAMMA_SCALE,
                 scaled_heads: str = "nope", **params):
        super().__init__(d_model, n_heads, pe, scaled_heads=scaled_heads, **params)
        self.delta = float(delta)
        self.gamma_scale = float(gamma_scale)
        # Parameters, not nn.Linear: the decoder's initialiser would overwrite a zero start.
        self.w_beta = nn.Parameter(torch.zeros(d_model, n_heads))
        self.w_gamma = nn.Parameter(torch.zeros(d_model, n_heads))

    def adaptive_params(self, x_rows):
        """``beta, gamma`` as ``[B, H, Lq]``."""
        x_rows = as_compute(x_rows)
        return self.params_of(x_rows @ self.w_beta.to(x_rows.dtype), x_rows @ self.w_gamma.to(x_rows.dtype))

    def params_of(self, beta_logits, gamma_logits):
        """``beta, gamma`` as ``[B, H, Lq]`` from the projections ``x . w_beta`` and ``x . w_gamma`` ``[B, Lq, H]``."""
        beta = F.softplus(beta_logits).transpose(1, 2)
        gamma = self.gamma_scale * torch.tanh(gamma_logits).transpose(1, 2)
        return beta, gamma

    def row_scale(self, query_positions, x_rows):
        beta, gamma = self.adaptive_params(x_rows)
        counts = (query_positions + 1).to(beta.dtype)[:, None]
        return adaptive_scale(counts, beta, gamma, self.delta)

    def project_scaled(self, x):
        """``q, k, v`` (``project``'s) and the factor (``head_factor``'s) from one product of ``x`` with the
        ``qkv`` weight and ``w_beta``, ``w_gamma`` side by side: one GEMM a layer and two in its backward,
        where the three projections apart take three and six."""
        width = 3 * self.d_model
        joint = F.linear(x, torch.cat([self.qkv.weight, self.w_beta.t(), self.w_gamma.t()]))
        q, k, v = self.split_qkv(joint[..., :width])
        beta, gamma = self.params_of(*as_compute(joint[..., width:]).split(self.n_heads, dim=-1))
        counts = (torch.arange(x.shape[1], device=x.device) + 1).to(beta.dtype)[:, None]
        return q, k, v, self.keep_unscaled(adaptive_scale(counts, beta, gamma, self.delta))

    def forward(self, x):
        if not (x.is_cuda and self.use_kernels):
            return super().forward(x)
        q, k, v, factor = self.project_scaled(x)
        return self.merge_heads(self.finish_heads(self.attend_scaled(q, k, v, factor, x), x), x)


@register_attention("ssmax", weights=ssmax_weights)
class SSMaxAttention(LogLengthScaled):
    """Scalable-Softmax (Nakanishi 2025): softmax(s * log(n_r + 1) * z), s learnable per head (start 1)."""

    def __init__(self, d_model, n_heads, pe, s_init: float = SSMAX_S_INIT_AUTHORS,
                 log_offset: int = SSMAX_LOG_OFFSET, scaled_heads: str = "nope", **params):
        super().__init__(d_model, n_heads, pe, s_init=s_init, scaled_heads=scaled_heads, **params)
        if log_offset not in (0, 1):
            raise ValueError(f"log_offset must be 0 (log n_r) or 1 (log(n_r + 1)), got {log_offset!r}")
        self.log_offset = int(log_offset)

    def weight_function(self, scores, mask, query_positions, x_rows):
        return ssmax_weights(scores, mask, s=self.s, query_positions=query_positions, log_offset=self.log_offset)

    def base_weights(self, z, mask):
        return safe_softmax(z, mask)


@register_attention("assmax", weights=assmax_weights)
class ASSMaxAttention(AdaptiveScaled):
    """Adaptive-scalable softmax (Long-Context Generalization with Sparse Attention): ASEntmax's per-token
    scaling applied to softmax."""

    def weight_function(self, scores, mask, query_positions, x_rows):
        beta, gamma = self.adaptive_params(x_rows)
        return assmax_weights(scores, mask, beta=beta, gamma=gamma, delta=self.delta, query_positions=query_positions)

    def base_weights(self, z, mask):
        return safe_softmax(z, mask)


@register_attention("adatemp", weights=adatemp_weights, kernel="lengthbench.kernels.adatemp:adatemp_attention")
class AdaptiveTemperatureAttention(AttentionLayer):
    """Adaptive temperature softmax (Velickovic et al. 2024): sharpen rows whose entropy exceeds 0.5."""

    def weights(self, scores, query_positions, x_rows):
        return adatemp_weights(scores, causal_mask(query_positions, scores.shape[-1]), query_positions)

    def attend(self, q, k, v, x):
        op = self.kernel() if q.is_cuda else None
        if op is not None:
            return op(q, k, v, slopes=self.pe.slopes())
        return self.reference_attend(q, k, v, x)
