"""Sieve's window as "Sieve Attention"'s Algorithm 1 (``sieve-window``): stick-breaking over every earlier key, the
weights kept within ``eps`` of the row's largest earlier score. The stick-breaking forward kernel finds the row
maxima itself before its walk (``stickbreaking.forward.row_max_earlier``) and stores the threshold for the backward.
"""

from __future__ import annotations

from lengthbench.kernels.defaults import SIEVE_WINDOW_EPS
from lengthbench.kernels.stickbreaking.op import StickBreakingAttention


def sieve_window_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=None, eps=SIEVE_WINDOW_EPS,
                           masked=True, tuning: dict | None = None):
    """Sieve's window as "Sieve Attention"'s Algorithm 1 (``sieve-window``), ``[B, H, T, D]`` causal: stick-breaking
    over every earlier key, the weights kept where ``z_rj >= max_{k<r} z_rk - eps`` (strictly above, ties at the
    boundary aside; default eps 2, ``defaults.SIEVE_WINDOW_EPS``).
    ``masked=False``: the stick broken over the kept keys only, as Sieve's definition breaks it over its
    filter. ``tuning``: the stick-breaking kernels' launch settings and levers (``stickbreaking.op.launch_config``;
    ``rowmax`` the key tiles of the row-max pass)."""
    return StickBreakingAttention.apply(q, k, v, slopes, row_scale, float(eps), sm_scale, bool(masked), tuning)
