"""A/B on the CPU: ASEntmax + NAPE trained on references whose raw scores are fp32 (as since session 18) or rounded
to bf16 as the references' were under the runner's CUDA autocast before (the q.k product, then the scale, in bf16;
the ALiBi bias in fp32). The smoke preset, 256 evaluation samples per length up to 8x.

    python benchmarks/bf16_scores_ab.py TASK fp32|bf16 SEED [RESULTS]

Prints one line: task, variant, seed and the score at each length. Session 18's lines are in
results/cpu/bf16_scores_ab.txt.
"""

from __future__ import annotations

import sys

import torch

from lengthbench.config import build_config
from lengthbench.models.attention import base
from lengthbench.runner import run_cell


def bf16_score_matrix(self, q_rows, k, query_positions):
    z = torch.matmul(q_rows.float(), k.float().transpose(-1, -2)).bfloat16()
    z = (z * self.score_scale).float()  # a bf16 tensor times a Python float stays bf16, as under autocast
    slopes = self.pe.slopes()
    if slopes is not None:
        distance = query_positions[:, None] - torch.arange(k.shape[-2], device=k.device)[None, :]
        z = z - slopes.float()[:, None, None] * distance.float()
    return z


def main() -> None:
    if len(sys.argv) not in (4, 5) or sys.argv[2] not in ("fp32", "bf16"):
        print("usage: bf16_scores_ab.py TASK fp32|bf16 SEED [RESULTS]", file=sys.stderr)
        sys.exit(2)
    task, variant, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    results = sys.argv[4] if len(sys.argv) == 5 else f"/tmp/bf16_scores_ab/{task}-{variant}"
    if variant == "bf16":
        base.AttentionLayer.score_matrix = bf16_score_matrix
    torch.set_num_threads(1)
    config = build_config(task, "asentmax", "nape", "smoke", seed=seed, max_multiplier=8, eval_samples=256,
                          diagnostics=False)
    rows = run_cell(config, results, device="cpu", progress=False)
    print(task, variant, seed, " ".join(f"{m}x {s:.3f}" for m, s in zip(rows.multiplier, rows.score, strict=True)),
          flush=True)


if __name__ == "__main__":
    main()
