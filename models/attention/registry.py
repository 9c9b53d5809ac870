"""The registry of attention mechanisms (``--attn``) and ``attention_weights``."""

from __future__ import annotations

import torch

from lengthbench.models.attention.base import WEIGHT_FUNCTIONS, AttentionLayer, causal_mask
from lengthbench.models.registry import Registry

ATTENTION: Registry[type[AttentionLayer]] = Registry("attention mechanism")


def register_attention(name: str, **kwargs):
    """Class decorator registering an :class:`AttentionLayer` subclass under ``name``."""

    def decorator(cls):
        cls.name = name
        return ATTENTION.register(name, **kwargs)(cls)

    return decorator


def attention_weights(name: str, scores: torch.Tensor, **params) -> torch.Tensor:
    """The dense causal weight map of mechanism ``name`` for raw scores ``[..., L, L]``.

    Row ``r`` is the query at position ``r``; entries ``j > r`` are exactly zero. Parameters take the
    defaults of ``../shared/specs/ATTENTION.md``. This is the reference every kernel is tested against.

    Parameters without a default: ``head_dim`` for ``tra`` and ``tda`` (whose ``scores`` are cosine
    scores), ``scores2`` (the second view's scores, same shape) for ``tda`` and ``diffsoftmax``. Learned
    parameters may be tensors: per head ``[H]`` (``s`` of ssmax and scalable-softpick, ``beta``/``gamma`` of
    sentmax) or per query row ``[..., L]`` (``beta``/``gamma`` of assmax and asentmax). Computed in float32,
    or float64 for float64 scores.
    """
    fn = WEIGHT_FUNCTIONS.get(name)
    length = scores.shape[-1]
    if scores.shape[-2] != length:
        raise ValueError(f"scores must be square [..., L, L], got {tuple(scores.shape)}")
    mask = causal_mask(torch.arange(length, device=scores.device), length)
    return fn(scores, mask, **params)
