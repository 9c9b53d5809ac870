"""Softpick attention: the fused op (``op.py``, on the kernels of ``utils/rowwise.py``) and a dense reference (``naive.py``)."""

from lengthbench.kernels.softpick.op import softpick_attention

__all__ = ["softpick_attention"]
