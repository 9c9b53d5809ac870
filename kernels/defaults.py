"""The defaults of the mechanism parameters that the fused ops take, each defined once: an op's signature (``kernels/``)
and its mechanism's module and dense weight function (``lengthbench.models.attention``) read it from here, so that an
op called at its defaults computes its mechanism at the mechanism's defaults. Plain values: importing this module
needs neither Triton nor a GPU.
"""

from __future__ import annotations

# Sieve's filter: the support of alpha-entmax of the scores ("Sieve Attention", Section 3; its Figure 4 ablation of
# alpha found 1.5 best)
SIEVE_ALPHA = 1.5
# The window of Algorithm 1's filter ("Sieve Attention", Appendix C: the keys with z >= max z - eps). The appendix
# gives no eps; it names its threshold "online alpha-entmax". eps = 1 / (alpha - 1), 2 at Sieve's alpha 1.5, is the
# narrowest window that holds every alpha-entmax support: the threshold of alpha-entmax on X = (alpha - 1) z is at
# least X_max - 1 (else the largest key alone would weigh more than 1), so a key of the support has z > z_max - 2.
SIEVE_WINDOW_EPS = 1.0 / (SIEVE_ALPHA - 1.0)
