"""A small pre-norm decoder whose attention mechanism and positional encoding are chosen by name.

    tokens (+ a feature embedding for tasks with per-position features)
    -> n_layers x [ x + attn(LayerNorm(x)); x + MLP(LayerNorm(x)) ]
    -> LayerNorm -> linear head over the task's vocabulary

as in Long-Context Generalization with Sparse Attention, eq. (1) (``arch = "prenorm"``, the default). ``arch = "gemma2"`` is the Gemma 2 layout that the
paper's public code builds its synthetic-task models from (Hugging Face's Gemma 2 with the attention swapped):

    tokens * sqrt(d_model)
    -> n_layers x [ x + RMSNorm(attn(RMSNorm(x))); x + RMSNorm(GeGLU(RMSNorm(x))) ]
    -> RMSNorm -> linear head

with RMSNorm's gain written ``1 + w`` (``w`` starting at 0), a GeGLU MLP (``down(gelu_tanh(gate(x)) * up(x))``)
and no biases anywhere. No dropout, no weight tying, no absolute positions in either: position information comes
only from the chosen encoding (or, for NoPE, from causality).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from lengthbench.models import ARCHS, INITS
from lengthbench.models.attention import ATTENTION
from lengthbench.models.positional import build_pe


@dataclass
class ModelConfig:
    vocab_size: int
    d_model: int = 256
    n_layers: int = 2
    n_heads: int = 8
    ffn: int = 512
    attn: str = "softmax"
    pe: str = "nape"
    attn_params: dict = field(default_factory=dict)
    pe_params: dict = field(default_factory=dict)
    has_features: bool = False
    init: str = "normal-0.02"  # N(0, 0.02^2) weights (GPT-2, Hugging Face Llama); "torch": PyTorch's defaults
    arch: str = "prenorm"  # "prenorm" (Long-Context Generalization with Sparse Attention's eq. (1)) or "gemma2" (that paper's public code)

    def to_dict(self) -> dict:
        return asdict(self)


class GemmaRMSNorm(nn.Module):
    """RMSNorm with the gain ``1 + w``, ``w`` starting at 0 (Gemma's form), eps 1e-6, computed in fp32."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)


class GeGLU(nn.Module):
    """``down(gelu_tanh(gate(x)) * up(x))``, no biases (Gemma 2's MLP)."""

    def __init__(self, d_model: int, ffn: int):
        super().__init__()
        self.gate = nn.Linear(d_model, ffn, bias=False)
        self.up = nn.Linear(d_model, ffn, bias=False)
        self.down = nn.Linear(ffn, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.gelu(self.gate(x), approximate="tanh") * self.up(x))


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int):
        super().__init__()
        if config.arch not in ARCHS:
            raise ValueError(f"unknown arch {config.arch!r}; choose from: {', '.join(ARCHS)}")
        head_dim = config.d_model // config.n_heads
        pe = build_pe(config.pe, config.n_heads, head_dim, **config.pe_params)
        self.attn = ATTENTION.get(config.attn)(config.d_model, config.n_heads, pe, **config.attn_params)
        self.attn.layer_index = layer_index
        self.post_norms = config.arch == "gemma2"
        if self.post_norms:
            self.attn_norm, self.attn_post_norm = GemmaRMSNorm(config.d_model), GemmaRMSNorm(config.d_model)
            self.mlp_norm, self.mlp_post_norm = GemmaRMSNorm(config.d_model), GemmaRMSNorm(config.d_model)
            self.mlp = GeGLU(config.d_model, config.ffn)
        else:
            self.attn_norm = nn.LayerNorm(config.d_model)
            self.mlp_norm = nn.LayerNorm(config.d_model)
            self.mlp = nn.Sequential(
                nn.Linear(config.d_model, config.ffn), nn.GELU(), nn.Linear(config.ffn, config.d_model)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.post_norms:
            x = x + self.attn_post_norm(self.attn(self.attn_norm(x)))
            return x + self.mlp_post_norm(self.mlp(self.mlp_norm(x)))
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


# cuBLAS wants the rows of a bf16 matrix 16 bytes apart: with the head's output (the vocabulary) an odd width, the
# logits' product and its two gradients take align-1 kernels, 161 us of a 3.2 ms step on the paper MQMTAR model
# (vocabulary 263) at batch 128 on an H200, 36 us padded. So on a GPU the head multiplies by its weight padded
# with zero rows to a multiple of HEAD_ALIGN and drops the padded logits: the same model and parameters, aligned
# products.
HEAD_ALIGN = 8


def head_logits(x: torch.Tensor, weight: torch.Tensor, padded: bool | None = None) -> torch.Tensor:
    """``x @ weight.T`` (a bias-free head), through a weight padded to :data:`HEAD_ALIGN` rows where ``padded``
    (by default: on a GPU)."""
    pad = -weight.shape[0] % HEAD_ALIGN
    if pad == 0 or not (x.is_cuda if padded is None else padded):
        return nn.functional.linear(x, weight)
    return nn.functional.linear(x, nn.functional.pad(weight, (0, 0, 0, pad)))[..., : weight.shape[0]]


class Decoder(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        # Max Retrieval's priorities: a small MLP encoder of the scalar feature, added to the token.
        self.feature_embed = (
            nn.Sequential(nn.Linear(1, config.d_model), nn.GELU(), nn.Linear(config.d_model, config.d_model))
            if config.has_features
            else None
        )
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm = GemmaRMSNorm(config.d_model) if config.arch == "gemma2" else nn.LayerNorm(config.d_model)
        # Gemma scales the token embeddings by sqrt(d_model) (in the embedding's dtype)
        self.embed_scale = config.d_model ** 0.5 if config.arch == "gemma2" else None
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.init == "normal-0.02":
            self.apply(_init_weights)
        elif config.init not in INITS:
            raise ValueError(f"unknown init {config.init!r}; choose from: {', '.join(INITS)}")

    @property
    def attention_layers(self):
        return [block.attn for block in self.blocks]

    def set_query_chunk(self, chunk: int | None) -> None:
        for layer in self.attention_layers:
            layer.query_chunk = chunk

    def embed_inputs(self, input_ids: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(input_ids)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        if self.feature_embed is not None:
            if features is None:
                features = torch.zeros(input_ids.shape, device=input_ids.device)
            x = x + self.feature_embed(features.to(x.dtype).unsqueeze(-1))
        return x

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed_inputs(input_ids, features)
        for block in self.blocks:
            x = block(x)
        return head_logits(self.norm(x), self.head.weight)

    def hidden_states(self, input_ids, features=None) -> list[torch.Tensor]:
        """The normalised input of every attention layer (what ``attention_map`` needs)."""
        x = self.embed_inputs(input_ids, features)
        states = []
        for block in self.blocks:
            states.append(block.attn_norm(x))
            x = block(x)
        return states


def _init_weights(module: nn.Module) -> None:
    """N(0, 0.02^2) for every linear and embedding weight (``init = "normal-0.02"``, the default). Its
    embeddings are 50 times smaller than PyTorch's N(0, 1). A plain associative-recall probe stays on its plateau with it and leaves it within 2,250 steps with PyTorch's
    initialisation (``init = "torch"``), while Copy + NAPE generalises to 16x-32x with it and fails from 2x on
    with PyTorch's."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)
