"""alpha-entmax attention (1.5 and 2, sparsemax): the long-context op (``op.py``) with its threshold search
(``threshold.py``) and candidate lists (``lists.py``), the short-rows kernels of training (``short_rows.py``), and a
dense reference (``naive.py``)."""

from lengthbench.kernels.entmax.op import entmax_attention, sparsemax_attention

__all__ = ["entmax_attention", "sparsemax_attention"]
