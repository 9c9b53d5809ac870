"""Sieve attention: its Section 3 form (``op.py``: the 1.5-entmax filter, then stick-breaking over it) and its
Algorithm 1 window (``window.py``, ``sieve-window``), with dense references (``naive.py``)."""

from lengthbench.kernels.sieve.op import sieve_attention
from lengthbench.kernels.sieve.window import sieve_window_attention

__all__ = ["sieve_attention", "sieve_window_attention"]
