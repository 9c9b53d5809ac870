"""ReLA (rectified linear attention, unnormalised): the fused op (``op.py``) and a dense reference (``naive.py``)."""

from lengthbench.kernels.rela.op import rela_attention

__all__ = ["rela_attention"]
