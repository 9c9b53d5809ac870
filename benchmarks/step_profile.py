"""Where a training step's GPU time goes, kernel by kernel, for mechanisms side by side (torch.profiler).

Builds the runner's Trainer for each ``--attns`` entry (the default step: one CUDA graph, compiled), runs its
warm-up and capture, then profiles three steps of the same code outside the graph (``GraphStep._eager``: the
kernels the graph replays) and prints each mechanism's GPU time a step, the captured step's own time a step (its
replays timed end to end: where it exceeds the kernels' time, the GPU waits between them) and, against the first
mechanism, the kernels whose time differs most:

    python benchmarks/step_profile.py --task mqmtar --attns softmax,stickbreaking,asentmax --pe rope --batch-size 128

A diagnosis tool for kernel and step work, not a table of record: it prints, after a header with the device,
date, commit and command; ``--out FILE`` appends the same text to FILE (the logs under
``results/benchmarks/gpu_logs/``).
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from lengthbench.config import build_config
from lengthbench.data import make_train_batch
from lengthbench.devices import device_description, git_sha
from lengthbench.tasks import get_task
from lengthbench.training import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_throughput import command_line  # noqa: E402


def kernel_times(task_name: str, attn: str, pe: str, batch_size: int, steps: int = 3,
                 replays: int = 50) -> tuple[dict[str, tuple[float, int]], float]:
    """Per kernel name: (GPU microseconds a step, launches a step) of the default training step; and the
    microseconds a step of the captured step itself, ``replays`` of it timed end to end on the GPU (the kernels,
    the gaps between them and whatever the host keeps the GPU waiting for)."""
    torch._dynamo.reset()
    config = build_config(task_name, attn, pe, "paper", batch_size=batch_size, train_samples=10**6)
    trainer = Trainer(config, get_task(task_name), torch.device("cuda"), Path("/tmp/lengthbench-profile"),
                      progress=False)
    stream = trainer.train_stream()
    batches = []
    for step in range(6):
        batch = [None if a is None else torch.as_tensor(a).cuda() for a in make_train_batch(stream, step)]
        if batch[2] is not None:
            batch[2] = batch[2].float()
        batches.append(batch)
    from lengthbench.kernels import _bridge

    _bridge.STATS.update(saved=0, recomputed=0)
    for batch in batches[:5]:  # the eager warm-up and the capture
        trainer.step_fn(*batch)
    torch.cuda.synchronize()
    padded = trainer.step_fn._pad(*batches[5])
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            trainer.step_fn._eager(*padded)
        torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        trainer.step_fn(*batches[5])
    end.record()
    torch.cuda.synchronize()
    kernels = {event.key[:90]: (event.device_time_total / steps, event.count // steps)
               for event in prof.key_averages() if event.device_time_total > 0}
    return kernels, start.elapsed_time(end) * 1000.0 / replays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="mqmtar")
    parser.add_argument("--attns", default="softmax,stickbreaking")
    parser.add_argument("--pe", default="rope")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--top", type=int, default=20, help="kernels listed per mechanism")
    parser.add_argument("--out", type=Path, help="also append the printed text to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("error: benchmarks/step_profile.py needs a CUDA GPU")
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    say(f"## profile {args.task} {args.attns} ({args.pe}, batch {args.batch_size})")
    say(f"device: {device_description(torch.device('cuda'))}; date: "
        f"{datetime.now(timezone.utc).isoformat(timespec='seconds')}; commit: {git_sha()}")
    say(f"command: {command_line()}")
    say()
    attns = args.attns.split(",")
    totals = {}
    for attn in attns:
        totals[attn], replayed = kernel_times(args.task, attn, args.pe, args.batch_size)
        from lengthbench.kernels._bridge import STATS

        busy = sum(t for t, _ in totals[attn].values())
        say(f"{attn}: {busy:,.0f} us a step (outside the graph, "
            f"{len(totals[attn])} kernel names; op backwards through the forward's graph {STATS['saved']}, "
            f"by a second forward {STATS['recomputed']}); the captured step {replayed:,.0f} us a step "
            f"({replayed - busy:+,.0f} us beside those kernels' time)")
    base = totals[attns[0]]
    say(f"\n{attns[0]}: its {args.top} longest kernels")
    for name, (micros, count) in sorted(base.items(), key=lambda item: -item[1][0])[:args.top]:
        say(f"{micros:9.1f} us  x{count:3d}  {name}")
    for attn in attns[1:]:
        names = set(base) | set(totals[attn])
        diff = {name: totals[attn].get(name, (0.0, 0))[0] - base.get(name, (0.0, 0))[0] for name in names}
        say(f"\n{attn} minus {attns[0]}: {sum(diff.values()):+,.0f} us a step")
        for name, delta in sorted(diff.items(), key=lambda item: -abs(item[1]))[:args.top]:
            say(f"{delta:+9.1f} us  x{totals[attn].get(name, (0, 0))[1]:3d} vs x{base.get(name, (0, 0))[1]:3d}  {name}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as handle:
            handle.write("\n".join(lines) + "\n\n")


if __name__ == "__main__":
    main()
