"""Rectified (ReLU) attention normalised by the row sum: the fused op (``op.py``) and a dense reference (``naive.py``)."""

from lengthbench.kernels.rectified.op import rectified_attention

__all__ = ["rectified_attention"]
