"""Training throughput (samples/s) of the runner's train step for a task's model, on one GPU.

Runs the real pipeline (background data workers -> device -> compiled step with bf16 autocast, fused
AdamW, clipping) for a few hundred steps per variant and records samples/s after warm-up:

    python benchmarks/train_throughput.py --task mqmtar --preset paper --batch-sizes 128,512,1024 \
        --pes rope,nape --out results/throughput

Writes ``<out>/train_throughput.parquet`` and ``.md`` with the device, date and command.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import torch

from lengthbench.config import build_config
from lengthbench.data import BatchProducer, TrainStream, default_workers
from lengthbench.runner import Trainer, _to_device, device_description
from lengthbench.tasks import get_task


def measure(task: str, attn: str, pe: str, preset: str, batch_size: int, compile_mode: str, steps: int,
            warmup: int) -> dict:
    config = build_config(task, attn, pe, preset, batch_size=batch_size, compile=compile_mode != "eager",
                          compile_mode=compile_mode if compile_mode != "eager" else "default",
                          train_samples=batch_size * (steps + warmup), eval_every=10**9, checkpoint_every=10**9)
    task_obj = get_task(task)
    device = torch.device("cuda")
    trainer = Trainer(config, task_obj, device, Path("/tmp/throughput"), progress=False)
    stream = TrainStream(task, (), 0, batch_size, config.train_length,
                         task_obj.max_tokens(config.train_length))
    producer = BatchProducer(stream, 0, steps + warmup, workers=default_workers("cuda"))
    started = None
    for step, (input_ids, labels, features) in enumerate(producer):
        if step == warmup:
            torch.cuda.synchronize()
            started = time.perf_counter()
        trainer.step_fn(_to_device(input_ids, device), _to_device(labels, device),
                        _to_device(features, device, torch.float32))
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    producer.close()
    params = sum(p.numel() for p in trainer.model.parameters())
    return dict(task=task, attn=attn, pe=pe, preset=preset, batch_size=batch_size, compile_mode=compile_mode,
                steps=steps, samples_per_s=steps * batch_size / seconds, step_ms=1000 * seconds / steps,
                parameters=params, tokens_per_sample=task_obj.max_tokens(config.train_length),
                layers=config.n_layers, d_model=config.d_model, heads=config.n_heads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="mqmtar")
    parser.add_argument("--attn", default="softmax")
    parser.add_argument("--pes", default="rope,nape")
    parser.add_argument("--preset", default="paper")
    parser.add_argument("--batch-sizes", default="128,512,1024")
    parser.add_argument("--compile-modes", default="default")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--out", default="results/throughput")
    args = parser.parse_args()
    rows = []
    for pe in args.pes.split(","):
        for mode in args.compile_modes.split(","):
            for batch_size in (int(b) for b in args.batch_sizes.split(",")):
                row = measure(args.task, args.attn, pe, args.preset, batch_size, mode, args.steps, args.warmup)
                rows.append(row)
                print(f"{pe:6s} {mode:16s} batch {batch_size:5d}: {row['samples_per_s']:10,.0f} samples/s "
                      f"({row['step_ms']:.2f} ms/step)", flush=True)
    frame = pd.DataFrame(rows)
    frame["device"] = device_description(torch.device("cuda"))
    frame["created_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    frame["command"] = "python " + " ".join(sys.argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(out / "train_throughput.parquet", index=False)
    columns = ["task", "attn", "pe", "batch_size", "compile_mode", "samples_per_s", "step_ms", "parameters",
               "tokens_per_sample"]
    (out / "train_throughput.md").write_text(
        f"# Training throughput\n\nDevice: {frame['device'].iloc[0]}; {frame['created_at'].iloc[0]}\n\n"
        f"Command: `{frame['command'].iloc[0]}`\n\n" + frame[columns].round(2).to_markdown(index=False) + "\n")


if __name__ == "__main__":
    main()
