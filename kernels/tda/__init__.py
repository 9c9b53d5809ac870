"""Threshold Differential Attention: the fused op (``op.py``) and a dense reference (``naive.py``)."""

from lengthbench.kernels.tda.op import tda_attention

__all__ = ["tda_attention"]
