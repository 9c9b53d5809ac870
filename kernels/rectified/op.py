"""Rectified softmax (Softpick, Appendix C): softmax over the visible scores ``z >= 0``; all-zero rows where none.

Online softmax restricted to ``z >= 0`` with the shift ``m = max(0, running max)``; a row whose sum stays 0
outputs 0 (and gets zero gradients). ``dz = p (do.v_j - do.o)`` on the selected entries, 0 elsewhere (the
selection itself is not differentiated). Kernels in ``utils/rowwise.py`` (code ``RECTIFIED``).
"""

from __future__ import annotations

from lengthbench.kernels.utils.rowwise import RECTIFIED, rowwise


def rectified_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=None, tuning: dict | None = None):
    """Rectified softmax attention, ``[B, H, T, D]`` causal; ``tuning``: launch settings
    (``utils.rowwise.launch_settings``)."""
    return rowwise(q, k, v, mech=RECTIFIED, slopes=slopes, row_scale=row_scale, sm_scale=sm_scale, tuning=tuning)
