"""Threshold-rectified attention (TRA): the fused op and its threshold (``op.py``), and a dense reference (``naive.py``)."""

from lengthbench.kernels.tra.op import tau_base, tra_attention, tra_threshold

__all__ = ["tau_base", "tra_attention", "tra_threshold"]
