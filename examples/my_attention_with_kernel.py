"""A lengthbench plugin with a fused op: sigmoid attention registered with its own kernel.

The mechanism is the one of ``my_attention.py`` (sigmoid attention, Ramapuram et al. 2024: ``a_rj = sigmoid(z_rj -
log n_r)``), under another name, and registered with an op that computes ``q, k, v -> o`` directly, a block of query
rows at a time, never holding the ``[L, L]`` weights (a plain-PyTorch op here; a Triton kernel registers the same
way). On CUDA the module calls the op; elsewhere its dense reference. Run it with::

    lengthbench run --task copy --attn sigmoid-op --pe nape --plugin examples/my_attention_with_kernel.py
"""

from __future__ import annotations

import math

import torch

from lengthbench.models.attention import AttentionLayer, causal_mask, register_attention


def sigmoid_op_weights(scores: torch.Tensor, mask: torch.Tensor, query_positions=None) -> torch.Tensor:
    """The dense map: ``sigmoid(z_rj - log n_r)`` on the visible keys."""
    positions = mask.sum(-1) - 1 if query_positions is None else query_positions
    bias = -torch.log((positions + 1).to(scores.dtype))[:, None]
    return torch.where(mask, torch.sigmoid(scores + bias), torch.zeros((), dtype=scores.dtype))


def sigmoid_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=None, block: int = 1024):
    """The fused op, ``[B, H, T, D]`` causal, with the signature of ``lengthbench.kernels``: ALiBi ``slopes`` and
    a ``row_scale`` on the scores where given; ``block`` query rows at a time (``[block, T]`` scores a head)."""
    tokens = q.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    dtype = torch.promote_types(v.dtype, torch.float32)  # 16-bit inputs: the scores and sums in fp32
    keys = torch.arange(tokens, device=q.device)
    out = []
    for start in range(0, tokens, block):
        rows = keys[start:start + block]
        z = q[..., rows, :].to(dtype) @ k.to(dtype).transpose(-1, -2) * scale
        if slopes is not None:
            z = z - slopes.to(dtype)[:, None, None] * (rows[:, None] - keys[None, :])
        if row_scale is not None:
            z = z * row_scale[..., rows, None].to(dtype)
        weights = torch.sigmoid(z - torch.log(rows + 1.0).to(dtype)[:, None]) * (keys[None, :] <= rows[:, None])
        out.append(weights @ v.to(dtype))
    return torch.cat(out, -2).to(v.dtype)


@register_attention("sigmoid-op", weights=sigmoid_op_weights, kernel=sigmoid_attention)
class SigmoidOpAttention(AttentionLayer):
    """Sigmoid attention with a fused op of its own: sigmoid(z - log n_r) per key, no normalisation."""

    def weights(self, scores, query_positions, x_rows):
        return sigmoid_op_weights(scores, causal_mask(query_positions, scores.shape[-1]), query_positions)

    def attend(self, q, k, v, x):
        op = self.kernel() if q.is_cuda else None  # the registered op, where it runs
        if op is not None:
            return op(q, k, v, slopes=self.pe.slopes())
        return self.reference_attend(q, k, v, x)
