"""Helpers the fused ops share: the problem's shapes and score tiles (``common``), the FlashAttention-style kernels of
the pointwise mechanisms (``rowwise``), the gathering of open rows (``open_rows``), torch SDPA's calls for the
softmax family (``sdpa``) and the custom op that makes a fused op a node of a compiled graph (``graph_node``)."""
