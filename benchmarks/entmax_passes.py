"""How many key passes the entmax threshold search needs after its first pass, simulated in numpy (no GPU):
the kernel's exact/Newton iteration (``kernels/entmax.py``) started from ``X_max - 1`` (the old start) and
from the exact threshold of each row's 16 largest tile maxima (tiles of 64 keys, the kernel's start).

    python benchmarks/entmax_passes.py --lengths 1024,4096,65536 --rows 5

Scores ``z ~ N(0, std^2)`` per row, ``X = z / 2``; prints the passes per row for each start.
"""

from __future__ import annotations

import argparse

import numpy as np


def passes(x: np.ndarray, tau: float, tol: float = 1e-6, max_iter: int = 40) -> tuple[int, float]:
    """The kernel's iteration on one row: passes until the exact step is accepted or the step is below tol."""
    for it in range(1, max_iter + 1):
        s = np.maximum(x - tau, 0.0)
        s1, s2, cnt = s.sum(), (s * s).sum(), float((s > 0).sum())
        x_low = x[s > 0].min() if cnt else np.inf
        disc = s1 * s1 - cnt * (s2 - 1.0)
        exact = (s2 - 1.0) / (s1 + np.sqrt(max(disc, 0.0))) if s1 > 0 else 0.0
        exact_ok = cnt > 0 and disc >= 0 and tau + exact < x_low
        newton = (s2 - np.sqrt(s2)) / s1 if s1 > 0 else 0.0
        step = max(exact if exact_ok else newton, 0.0)
        tau += step
        if exact_ok or step <= tol * (1 + abs(tau)):
            return it, tau
    return max_iter, tau


def subset_start(x: np.ndarray, tile: int = 64, topk: int = 16) -> float:
    """The exact threshold of the ``topk`` largest tile maxima (a lower bound on the row's threshold)."""
    maxima = np.array([x[i:i + tile].max() for i in range(0, len(x), tile)])
    top = np.sort(maxima)[::-1][:topk]
    return passes(top, top.max() - 1.0)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1024,4096,65536")
    parser.add_argument("--stds", default="1,2")
    parser.add_argument("--rows", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print("keys  std  passes from X_max - 1  |  passes from the top-16 subset threshold")
    for tokens in [int(t) for t in args.lengths.split(",")]:
        for std in [float(s) for s in args.stds.split(",")]:
            old, new = [], []
            for _ in range(args.rows):
                x = rng.standard_normal(tokens) * std / 2
                old.append(passes(x, x.max() - 1.0)[0])
                new.append(passes(x, max(subset_start(x), x.max() - 1.0))[0])
            print(f"{tokens:6d} {std:4.1f}  {old}  |  {new}")


if __name__ == "__main__":
    main()
