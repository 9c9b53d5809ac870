"""The query, key and value heads of the fused projections in one kernel each way (RoPE, unit norms, the copies to
``[B, H, T, D]``): the prologue of every fused op (``op.py``) and a dense reference (``naive.py``)."""

from lengthbench.kernels.qkv_heads.op import head_views, qkv_heads, unit_views

__all__ = ["head_views", "qkv_heads", "unit_views"]
