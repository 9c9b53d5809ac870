"""The defaults of the mechanism parameters that the fused ops take, each defined once: an op's signature (``kernels/``)
and its mechanism's module and dense weight function (``lengthbench.models.attention``) read it from here, so that an
op called at its defaults computes its mechanism at the mechanism's defaults (``tests/test_op_defaults.py``
checks it for every op of the registry). Plain values: importing this module needs neither Triton nor a GPU.
"""

from __future__ import annotations

# entmax ("Long-Context Generalization with Sparse Attention", Section 3)
ENTMAX_ALPHA = 1.5
# Sieve's filter: the support of alpha-entmax of the scores ("Sieve Attention", Section 3; its Figure 4 ablation of
# alpha found 1.5 best)
SIEVE_ALPHA = 1.5
# Where what is left of Sieve's stick goes: nowhere ("drop", the default: "Sieve Attention", Section 3, Eq. 7, whose
# weights cover the earlier tokens only, rows summing to 1 - prod_S (1 - sigmoid(z))) or on the query's own value
# ("diagonal", as stick-breaking's: rows sum to one)
REMAINDERS = ("diagonal", "drop")
SIEVE_REMAINDER = "drop"
# The window of Algorithm 1's filter ("Sieve Attention", Appendix C: the keys with z >= max z - eps). The appendix
# gives no eps; it names its threshold "online alpha-entmax". eps = 1 / (alpha - 1), 2 at Sieve's alpha 1.5, is the
# narrowest window that holds every alpha-entmax support: the threshold of alpha-entmax on X = (alpha - 1) z is at
# least X_max - 1 (else the largest key alone would weigh more than 1), so a key of the support has z > z_max - 2.
SIEVE_WINDOW_EPS = 1.0 / (SIEVE_ALPHA - 1.0)
# softpick's denominator epsilon ("Softpick: No Attention Sink, No Massive Activations with Rectified Softmax")
SOFTPICK_EPS = 1e-6
# TRA's threshold beta sqrt(2 log(n / kappa) / d) and its power, and TDA's lambda ("Threshold Differential Attention
# for Sink-Free, Ultra-Sparse, and Non-Dispersive Language Modeling", Sections 4.1-4.2 and Algorithm 1; the row
# index of ``tau_index`` in docs/conventions.md)
TRA_BETA = 1.0
TRA_KAPPA = 1.0
TRA_POWER = 2.0
TRA_TAU_INDEX = "alg1"
TDA_LAM = 0.5
