"""Attention mechanisms (``--attn``): each a short module beside its dense reference."""

from lengthbench.models.attention.base import WEIGHT_FUNCTIONS, AttentionLayer, causal_mask, visible_counts
from lengthbench.models.attention.registry import ATTENTION, attention_weights, register_attention

# Importing the modules registers their mechanisms.
from lengthbench.models.attention import softmax as _softmax  # noqa: E402,F401,I001

__all__ = [
    "ATTENTION",
    "WEIGHT_FUNCTIONS",
    "AttentionLayer",
    "attention_weights",
    "causal_mask",
    "register_attention",
    "visible_counts",
]
