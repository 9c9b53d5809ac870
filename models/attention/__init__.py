"""Attention mechanisms (``--attn``): each a short module beside its dense reference, both registered at once
by ``register_attention(name, weights=...)`` on the module.

| module | mechanisms |
|---|---|
| ``softmax`` | softmax, gated |
| ``scaled`` | ssmax, assmax, adatemp |
| ``entmax`` | entmax, sparsemax, sentmax, asentmax |
| ``stickbreaking`` | stickbreaking, sieve, sieve-window |
| ``softpick`` | softpick, scalable-softpick, rectified |
| ``threshold`` | rela, tra, tda |
| ``differential`` | diffsoftmax |
"""

import importlib

from lengthbench.models.attention.base import (
    AttentionLayer,
    HeadRMSNorm,
    TwoViewAttention,
    causal_mask,
    visible_counts,
)
from lengthbench.models.attention.registry import (
    ATTENTION,
    KERNELS,
    MECHANISMS,
    WEIGHT_FUNCTIONS,
    Mechanism,
    attention_weights,
    get_kernel,
    kernel_names,
    load_kernel,
    register_attention,
)

# Importing the modules registers their mechanisms (in this order: `lengthbench attn list` shows it).
for _module in ("softmax", "scaled", "entmax", "stickbreaking", "softpick", "threshold", "differential"):
    importlib.import_module(f"lengthbench.models.attention.{_module}")

__all__ = [
    "ATTENTION",
    "KERNELS",
    "MECHANISMS",
    "Mechanism",
    "WEIGHT_FUNCTIONS",
    "AttentionLayer",
    "HeadRMSNorm",
    "TwoViewAttention",
    "attention_weights",
    "causal_mask",
    "get_kernel",
    "kernel_names",
    "load_kernel",
    "register_attention",
    "visible_counts",
]
