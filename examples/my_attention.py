"""A lengthbench plugin: sigmoid attention, registered from outside the package.

Sigmoid attention (Ramapuram et al. 2024) weighs each visible key independently,
``a_rj = sigmoid(z_rj + b_r)``, with the bias ``b_r = -log(n_r)`` so that a row's total stays near one
however many keys it sees. Run it with::

    lengthbench run --task copy --attn sigmoid --pe nape --plugin examples/my_attention.py

or name it in ``LENGTHBENCH_PLUGINS`` (docs/plugins.md).
"""

from __future__ import annotations

import torch

from lengthbench.models.attention import AttentionLayer, causal_mask, register_attention


# The pure map: registered with the module below (which calls it too), attention_weights("sigmoid", scores)
# returns it.
def sigmoid_weights(scores: torch.Tensor, mask: torch.Tensor, query_positions=None) -> torch.Tensor:
    positions = mask.sum(-1) - 1 if query_positions is None else query_positions  # row r's position
    bias = -torch.log((positions + 1).to(scores.dtype))[:, None]
    return torch.where(mask, torch.sigmoid(scores + bias), torch.zeros((), dtype=scores.dtype))


@register_attention("sigmoid", weights=sigmoid_weights)
class SigmoidAttention(AttentionLayer):
    """Sigmoid attention (Ramapuram et al. 2024): sigmoid(z - log n_r) per key, no normalisation."""

    def weights(self, scores, query_positions, x_rows):
        return sigmoid_weights(scores, causal_mask(query_positions, scores.shape[-1]), query_positions)
