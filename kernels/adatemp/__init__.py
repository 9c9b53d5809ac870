"""Adaptive-temperature softmax attention: the fused op (``op.py``) and a dense reference (``naive.py``)."""

from lengthbench.kernels.adatemp.op import adatemp_attention

__all__ = ["adatemp_attention"]
