"""One fused op's forward, a few times over, for a profiler to read (Nsight Compute); no timing of its own.

    ncu --clock-control none --set full --import-source yes -k regex:_fwd_kernel --launch-skip 2 --launch-count 1 \\
        python benchmarks/profile_forward.py --mechanism sieve-window --tokens 16384 --inputs walk8

The inputs are ``benchmarks/kernels.py``'s families ``random``, ``walk4`` and ``walk8`` (B 1, bf16, seed 0);
``--tuning`` passes launch settings to the op (JSON, as ``kernels.py``'s ``--variant``). Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch

from lengthbench.errors import UsageError
from lengthbench.kernels import get_kernel

SHIFTS = {"random": 0.0, "walk4": -4.0, "walk8": -8.0}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mechanism", default="sieve-window")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--inputs", default="walk8", choices=sorted(SHIFTS))
    parser.add_argument("--tuning", default="", help="JSON launch settings for the op")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    try:
        if not torch.cuda.is_available():
            raise UsageError("profile_forward.py needs a CUDA GPU")
        tuning = json.loads(args.tuning) if args.tuning else None
        op = get_kernel(args.mechanism)
        if op is None:
            raise UsageError(f"no fused op for {args.mechanism!r} here")
    except (UsageError, ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (1, args.heads, args.tokens, args.head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    shift = SHIFTS[args.inputs]
    if shift:  # every score moved by ``shift`` (benchmarks/kernels.py's walk inputs)
        q[..., 0] = 1.0
        k[..., 0] = shift * math.sqrt(args.head_dim)
    kwargs = {"tuning": tuning} if tuning else {}
    with torch.no_grad():
        for _ in range(args.repeats):
            out = op(q, k, v, **kwargs)
    torch.cuda.synchronize()
    mean = out.float().abs().mean().item()
    print(f"{args.mechanism} {args.inputs} L={args.tokens} D={args.head_dim}: mean |out| {mean:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
