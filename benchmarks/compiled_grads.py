"""One training step's loss and gradients of a model on four paths, against the eager fused ops.

Session 18's ASEntmax + NAPE models trained on their compiled dense references (``--train-attention reference``)
learned MQMTAR in distribution but scored 0 from 2x; session 19's (with the references' scores in fp32) did not learn
at all (loss 3.42 from step 5,000 on), where every eager model on the fused op learned. This tells, on one real
training batch, whether the compiled step's gradients are those of the eager model:

- ``fused``: eager, the fused ops (the path the store's rows trained on), the yardstick;
- ``reference``: eager, the dense references;
- ``compiled[...]``: the runner's compiled step (``torch.compile`` of the loss under CUDA bf16 autocast) on the
  references, in a compile mode, with ``torch._functorch.config.backward_pass_autocast`` as given, and with the
  references' ``q.k`` in fp32 (the code since session 18) or, ``bf16-scores``, under autocast (session 18's).

    python benchmarks/compiled_grads.py --attn asentmax --pe nape --preset paper --batch 128 --out DIR

Prints each path's loss and, per parameter group, the gradient's relative distance to ``fused``; writes
``<out>/compiled_grads.json``. A CUDA script (on a CPU every path is the reference).

What it found (session 19, an H200, torch 2.11; ``results/gpu/device_output/2026-11-23-s19-h100/call3-grads`` and
``call4-grads``): every group within 5e-3 of ``fused`` (bf16 autocast) except ``w_gamma``, 159 times its norm away
(reduce-overhead), 79.5 (default mode), 14.5 (bf16 scores), whatever ``backward_pass_autocast``. The culprit is
Inductor's gradient of ``log(n + 1) ** gamma`` (``pow`` with a tensor exponent): written
``exp(gamma * log(log(n + 1)))`` (``adaptive_scale`` since then) every compiled variant is at 4.6e-3, as eager.
``:pow-scale`` puts the old form back, to check a torch version.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from lengthbench.config import build_config
from lengthbench.data import TrainStream, make_train_batch
from lengthbench.models.attention.base import AttentionLayer
from lengthbench.runner import autocast, build_model, device_description
from lengthbench.tasks import get_task

GROUPS = ("qkv", "attn.out", "w_beta", "w_gamma", "mlp.", "norm", "embed", "head", "other")


def group_of(name: str) -> str:
    for group in GROUPS[:-1]:
        if group in name:
            return group
    return "other"


@contextlib.contextmanager
def pow_scale():
    """The adaptive scale as ``log(n + 1) ** gamma`` (``pow`` with a tensor exponent), as before session 19."""
    from lengthbench.models.attention import entmax, scaled

    exp_form = scaled.adaptive_scale
    calls = []

    def adaptive_scale(counts, beta, gamma, delta):
        calls.append(1)
        return delta + scaled.per_row(beta, counts) * torch.log(counts + 1) ** scaled.per_row(gamma, counts)

    scaled.adaptive_scale = entmax.adaptive_scale = adaptive_scale
    try:
        yield
    finally:
        scaled.adaptive_scale = entmax.adaptive_scale = exp_form
        print(f"  (pow-scale: the old form ran {len(calls)} times while traced)", flush=True)


@contextlib.contextmanager
def bf16_scores():
    """Session 18's references: ``q.k`` under the caller's autocast (bf16 on CUDA)."""
    AttentionLayer.fp32_scores = False
    try:
        yield
    finally:
        AttentionLayer.fp32_scores = True


def parse_variant(text: str) -> tuple[str, list[str]]:
    """``MODE:BACKWARD_AUTOCAST:SCORES[:pow-scale]`` as ``(text, parts)``; ValueError with the reason."""
    parts = text.strip().split(":")
    choices = (("default", "reduce-overhead", "max-autotune"), ("same_as_forward", "off"), ("fp32", "bf16-scores"))
    ok = len(parts) in (3, 4) and all(part in options for part, options in zip(parts[:3], choices, strict=False))
    if not ok or (len(parts) == 4 and parts[3] != "pow-scale"):
        raise ValueError(f"bad variant {text.strip()!r}: give MODE:BACKWARD_AUTOCAST:SCORES[:pow-scale], MODE one of "
                         f"{', '.join(choices[0])}, BACKWARD_AUTOCAST same_as_forward or off, SCORES fp32 or bf16-scores")
    return text.strip(), parts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="mqmtar")
    parser.add_argument("--attn", default="asentmax")
    parser.add_argument("--pe", default="nape")
    parser.add_argument("--preset", default="paper")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--step", type=int, default=7, help="which training batch")
    parser.add_argument("--variants", default="reduce-overhead:same_as_forward:fp32,default:same_as_forward:fp32,"
                        "reduce-overhead:off:fp32,reduce-overhead:same_as_forward:bf16-scores",
                        help="comma-separated MODE:BACKWARD_AUTOCAST:SCORES[:pow-scale] (SCORES fp32 or bf16-scores; "
                        "pow-scale: the adaptive scale as log(n+1)**gamma, the code before session 19)")
    parser.add_argument("--calls", type=int, default=3, help="calls of each compiled step (CUDA graphs record first)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    import torch._functorch.config as functorch_config

    try:
        variants = [parse_variant(text) for text in args.variants.split(",")]
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = build_config(args.task, args.attn, args.pe, args.preset)
    task = get_task(config.task, **dict(config.task_params))
    torch.manual_seed(config.seed)
    model = build_model(config, task).to(device)
    width = task.max_tokens(config.train_length)
    stream = TrainStream(config.task, tuple(sorted(config.task_params.items())), config.seed, args.batch,
                         config.train_length, width, width)
    ids, labels, features = (None if a is None else torch.as_tensor(a, device=device)
                             for a in make_train_batch(stream, args.step))

    def forward_loss(input_ids, labels, features):
        with autocast(device):
            logits = model(input_ids, features)
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)

    def run(fn, kernels: bool, calls: int = 1):
        for block in model.blocks:
            block.attn.use_kernels = kernels
        for _ in range(calls):
            model.zero_grad(set_to_none=True)
            loss = fn(ids, labels, features)
            loss.backward()
        torch.cuda.synchronize() if device.type == "cuda" else None
        return loss.item(), {n: p.grad.detach().float().clone() for n, p in model.named_parameters()
                             if p.grad is not None}

    print(f"{device_description(device)}; torch {torch.__version__}; {args.task} {args.attn}+{args.pe} "
          f"{args.preset}, batch {args.batch} x {ids.shape[1]} tokens; backward_pass_autocast default "
          f"{getattr(functorch_config, 'backward_pass_autocast', 'absent')!r}", flush=True)
    results = {}
    base_loss, base = run(forward_loss, True)
    results["fused"] = {"loss": base_loss}
    paths = [("reference", None)] + variants
    for name, variant in paths:
        started = time.perf_counter()
        try:
            if variant is None:
                loss, grads = run(forward_loss, False)
            else:
                mode, backward, scores, *rest = variant
                torch._dynamo.reset()
                functorch_config.backward_pass_autocast = backward
                with contextlib.ExitStack() as stack:
                    if scores == "bf16-scores":
                        stack.enter_context(bf16_scores())
                    if "pow-scale" in rest:
                        stack.enter_context(pow_scale())
                    fn = torch.compile(forward_loss, dynamic=False, mode=mode)
                    loss, grads = run(fn, False, args.calls)
                name = f"compiled[{name}]"
        except Exception as error:  # noqa: BLE001 - report and go on to the next path
            print(f"{name}: failed: {type(error).__name__}: {str(error).splitlines()[0][:200]}", flush=True)
            continue
        row = {"loss": loss, "seconds": time.perf_counter() - started}
        for group in GROUPS:
            names = [n for n in base if group_of(n) == group]
            if not names:
                continue
            diff = sum(float((grads.get(n, torch.zeros_like(base[n])) - base[n]).pow(2).sum()) for n in names)
            norm = sum(float(base[n].pow(2).sum()) for n in names)
            row[group] = (diff / max(norm, 1e-30)) ** 0.5
        results[name] = row
        groups = "  ".join(f"{g} {row[g]:.2e}" for g in GROUPS if g in row)
        print(f"{name:<52} loss {loss:.6f} (fused {base_loss:.6f}), {row['seconds']:.0f} s; grad rel. dist. to "
              f"fused: {groups}", flush=True)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "compiled_grads.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
