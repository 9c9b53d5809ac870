"""A numpy model of the entmax first stage's open rows and of the rescue (``kernels/entmax.py``, ``rescue``).

For rows that see every one of ``--tokens`` keys (N(0, 1) q and k times ``--scale``, head dim ``--head-dim``,
``X = z / 2`` for 1.5-entmax), it keeps the top 4 of every column of 64 keys, finds the subset's exact threshold
``tau_sub``, and counts: the rows left open (a column's 4th largest above ``tau_sub``), their saturated columns,
and the candidates a rescue would list (the kept values above ``tau_sub`` in the other columns, every key above
it in the saturated ones), against the list's 64 slots. No packing, no margins: the kernel's ``eps`` moves
these counts slightly.

    python benchmarks/rescue_model.py --scales 1.0,0.7,0.5
"""

from __future__ import annotations

import argparse

import numpy as np


def entmax15_threshold(x: np.ndarray) -> float:
    """The exact threshold of 1.5-entmax over ``x`` (``sum (x - t)_+^2 = 1``)."""
    x = np.sort(x)[::-1]
    k = np.arange(1, len(x) + 1)
    cs, cs2 = np.cumsum(x), np.cumsum(x * x)
    delta = (1 - (cs2 - cs * cs / k)) / k
    t = cs / k - np.sqrt(np.maximum(delta, 0))
    ok = (delta >= 0) & (t <= x) & (np.append(x[1:], -np.inf) <= t)
    return float(t[np.argmax(ok)])


def model(tokens: int, head_dim: int, scale: float, rows: int, seed: int, columns: int = 64, depth: int = 4,
          slots: int = 64) -> dict:
    rng = np.random.default_rng(seed)
    keys = rng.standard_normal((tokens, head_dim)) * scale
    open_rows, saturated, candidates, support = [], [], [], []
    for _ in range(rows):
        x = keys @ (rng.standard_normal(head_dim) * scale) / np.sqrt(head_dim) / 2
        cols = x.reshape(-1, columns)
        top = -np.sort(-cols, axis=0)[:depth]
        tau_sub = entmax15_threshold(top.ravel())
        # a column of at most ``depth`` keys keeps them all: nothing is left out of it
        sat = top[-1] > tau_sub if cols.shape[0] > depth else np.zeros(columns, dtype=bool)
        support.append(int((x > entmax15_threshold(x)).sum()))
        open_rows.append(bool(sat.any()))
        if sat.any():
            saturated.append(int(sat.sum()))
            candidates.append(int((top[:, ~sat] > tau_sub).sum() + (cols[:, sat] > tau_sub).sum()))
    saturated, candidates = np.array(saturated), np.array(candidates)
    n_open = max(len(saturated), 1)
    return dict(scale=scale, open=float(np.mean(open_rows)), support=float(np.mean(support)),
                saturated_mean=float(saturated.mean()) if len(saturated) else 0.0,
                saturated_max=int(saturated.max()) if len(saturated) else 0,
                candidates_mean=float(candidates.mean()) if len(candidates) else 0.0,
                fit=float((candidates <= slots).sum() / n_open),
                scanned=float(saturated.mean() / columns) if len(saturated) else 0.0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--scales", default="1.0,0.7")
    parser.add_argument("--rows", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for scale in (float(s) for s in args.scales.split(",")):
        r = model(args.tokens, args.head_dim, scale, args.rows, args.seed)
        print(f"scale {scale}: {r['open']:.1%} of rows open; support {r['support']:.1f} keys; open rows: "
              f"{r['saturated_mean']:.2f} saturated columns (max {r['saturated_max']}), "
              f"{r['candidates_mean']:.1f} candidates, {r['fit']:.1%} within 64 slots, "
              f"{r['scanned']:.2%} of the keys scanned")


if __name__ == "__main__":
    main()
