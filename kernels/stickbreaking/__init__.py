"""Stick-breaking attention: the op (``op.py``), its forward and backward kernels, its arithmetic (``stick.py``) and a
dense reference (``naive.py``)."""

from lengthbench.kernels.stickbreaking.op import stickbreaking_attention

__all__ = ["stickbreaking_attention"]
