"""The launch settings of the entmax search, its candidate lists and Sieve's list kernels. Not an op.

``launch_config(block_d, tuning)`` gives them for a head-dim block (``Problem.block_d``): the defaults below,
with ``tuning`` (a dict of some of the same keys, or None) replacing some of them. Every op that uses them
(``entmax_attention``, ``sparsemax_attention``, ``sieve_attention``, ``entmax_threshold``) takes ``tuning``
as an argument: benchmarks and tests compare settings that way; the models take the defaults.

The keys:

- ``split`` False: one kernel, query tile ``bm``, key tiles ``bn`` in the Newton passes and ``bn_subset`` in
  the first stage (the subset's columns), ``warps``, ``stages``. ``split`` True: the first stage with those
  settings, then the Newton passes over the open rows only, gathered, with ``newton = (bm, bn, warps,
  stages)``. A query tile must be a multiple of its kernel's key tiles.
- The search: ``subset`` (0: the 16 largest tile maxima, no certificate; d in 1..4: the top d of every
  column), ``acc`` (elementwise partial sums in the exact-root Newton passes), ``fold`` (where there are no
  slopes, one product a score by the row's ``sm_scale * XS``, times its row scale; entmax's output pass too),
  ``lean`` (the Newton passes accumulate only what Newton's step needs; False: also the support's count and
  least score, for the exact root),
  ``bracket`` (with ``lean``, 1.5-entmax: the passes also count the support, and a row ends once the
  support's quadratic brackets ``tau*`` within ``tol``, ``threshold._bracket``) and
  ``pairs`` (the top-4 first stage merges two key tiles a step, ``_insert_pair``; the kept values are the
  same, bit for bit).
- ``lists``: the forward of ``entmax_attention`` and ``sieve_attention`` finishes the certified rows from
  their candidate lists (False: the threshold, then a pass over all keys). ``list_size`` C slots a row,
  ``finish`` (rows a program, warps) of the kernel that finishes the listed rows.
- ``alibi_skip``, ``rescue`` (``max_sat``, ``rescue_launch`` = (rows a program, keys a step, warps)): see
  ``entmax/lists.py``.
- Sieve: ``list_backward`` (elements of a program's [rows, C, BD] blocks, warps) over the listed rows,
  ``open_backward`` (bm, bn, warps, stages) over the open ones (the stick-breaking backward's tiles),
  ``sieve_scan`` (the listed rows' stick by a cumulative sum over the candidates sorted by key, instead of
  [rows, C, C] comparisons), ``sieve_open`` (the open rows' forward walk's tiles; None: ``newton``'s).
- ``sample`` (stride, keys, tokens) or None: from ``tokens`` on, entmax's forward (``lists._sample_kernel``)
  estimates the threshold of a query tile from every ``stride``-th key, where its rows see at least ``keys`` of
  them (a tile of narrow rows stops at every fourth of those); a tile with three quarters of its rows wider
  than the lists starts its Newton passes there instead of taking the first stage.
- ``few_open``, ``newton_few``, ``sieve_open_few``, ``newton_phases``, ``sieve_phases``, ``phases_from``: the
  open rows' launches, see ``utils/open_rows.py``.
"""

from __future__ import annotations

# alpha -> the factor X = (alpha - 1) z of the threshold kernels; the output pass's POWER is 1 / (alpha - 1).
ALPHAS = {1.5: 0.5, 2.0: 1.0}


def check_alpha(alpha) -> float:
    alpha = float(alpha)
    if alpha not in ALPHAS:
        raise ValueError(f"the entmax kernels implement alpha = 1.5 and 2 (sparsemax) only, got {alpha}")
    return alpha


def launch_config(block_d: int, tuning: dict | None = None) -> dict:
    """The launch settings for head-dim block ``block_d``: the defaults, with ``tuning``'s keys replacing
    theirs (a ``ValueError`` names an unknown key)."""
    small = block_d <= 64
    if small:
        # Measured on the H100: the four levels of 64 columns spill 16 bytes here, which costs less than
        # 8-warp tiles without spills (21 against 25 ms for the first stage at L 65,536, D 32). ``newton``'s 3
        # stages: entmax's forward 30.2 -> 29.0 ms, Sieve's 34.4 -> 33.1 at L 65,536, D 32 (32-row tiles were
        # slower on a trained model's wider rows). Its 64-key tiles (against 32) on an H200 at L 65,536, H 16,
        # D 32, bf16, q and k N(0, 1) times 0.3 / 0.45 / 1 (supports of ~1,900 / 500 / 34 keys): entmax's forward
        # 78.1 -> 69.8, 69.1 -> 61.8 and 28.0 -> 26.9 ms.
        # Sieve's open rows keep their walk on 32-key tiles (``sieve_open``). ``fold`` with a row scale
        # (ASEntmax), in sm_90 SASS a key tile of 64 x 64 scores (results/benchmarks/sass_entmax_loops.txt; not
        # timed on a GPU): the Newton passes 301 -> 237 instructions, the first stage 675 -> 611, the open rows'
        # output pass without a backward 320 -> 216 (without a row scale 288 -> 216: no row sums of s).
        config = dict(bm=64, bn=64, bn_subset=64, warps=4, stages=2, newton=(64, 64, 4, 3), split=True, subset=4,
                      acc=False, fold=True, lean=True, bracket=True, pairs=True)
    else:  # the single-view kernels' tiles, not measured
        config = dict(bm=32, bn=32, bn_subset=32, warps=4, stages=2, newton=(32, 32, 4, 2), split=True, subset=4,
                      acc=False, fold=True, lean=True, bracket=True, pairs=True)
    # ``finish`` not measured; Sieve's ``list_backward`` and ``open_backward`` measured once (the backward 52 ms
    # at L 65,536 on the H100), no other setting tried.
    config.update(lists=True, list_size=64, finish=(max(1, 128 // block_d), 4), list_backward=(4096, 4),
                  open_backward=(64, 64, 4, 2) if small else (32, 32, 4, 2),
                  alibi_skip=True,
                  # H100, L 65,536, D 32: entmax's forward 34.0 -> 30.5 ms, Sieve's 50.5 -> 34.7 with the rescue
                  rescue=True, max_sat=4, rescue_launch=(16, 64, 2),
                  # H100, L 65,536, D 32: Sieve's forward 34.4 -> 31.9 ms (2 rows a program at C 64 without)
                  sieve_scan=True,
                  sieve_open=(64, 32, 4, 3) if small else None,
                  # H100, L 65,536, D 32: Sieve's forward 30.68 -> 29.26 ms with 16-row tiles for few open rows
                  # (32-row tiles 29.71); the Newton kernel's few-row tiles were slower (30.3-32.4 ms)
                  few_open=(256, 16384), newton_few=None, sieve_open_few=(16, 16, 2, 3),
                  # a trained MQMTAR Sieve + NoPE model's sample at 65,536 tokens on the H100: 206.7 ms in one
                  # launch each -> (2,) 202.2 (the Newton kernel 37.1 -> 31.6 ms); the walk (512, 2048, 8192)
                  # 167.5 (68.7 -> 28.5 ms); (2,) with (2048, 8192) 163.5
                  newton_phases=(2,), sieve_phases=(512, 2048, 8192), phases_from=8192,
                  # H100, the fresh MQMTAR paper model's layers 0 and 3 (61,193 tokens): entmax's forward 50.9 ->
                  # 42.7 and 52.7 -> 39.3 ms; every 4th key 41.4 and 40.7; N(0, 1) rows 26.2 -> 27.4 (28.4 at 4)
                  # (commit 2278ece, a tile taking its estimates only with every row wide)
                  sample=(8, 512, 8192))
    tuning = dict(tuning or {})
    unknown = sorted(set(tuning) - set(config))
    if unknown:
        raise ValueError(f"entmax tuning: unknown keys {unknown}; the keys are {sorted(config)}")
    return {**config, **tuning}
