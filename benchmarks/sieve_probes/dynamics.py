"""Train the smoke model on n-back (NoPE) with the library's Trainer and log, every K steps and per layer: the
mean size of the 1.5-entmax support over ``j < r``, how often key ``r - 1`` is in it, the largest head's mean
weight on ``r - 1``, the spread of the scores over the keys, and the training loss and accuracy.

    python benchmarks/sieve_probes/dynamics.py ATTN [K] [key=value attention params ...]

``TS=N`` in the environment overrides the training samples; ``OUT`` (default /tmp/sieve_probes) holds the
checkpoints.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sieve_variants  # noqa: E402, F401 (registers the variants)

from lengthbench.config import build_config  # noqa: E402
from lengthbench.models.attention.base import causal_mask, diagonal_and_earlier  # noqa: E402
from lengthbench.models.attention.stickbreaking import sieve_support  # noqa: E402
from lengthbench.runner import Trainer  # noqa: E402
from lengthbench.tasks import get_task  # noqa: E402


def main() -> None:
    attn = sys.argv[1]
    every = int(sys.argv[2]) if len(sys.argv) > 2 else 50
    params = {key: float(value) for key, value in (kv.split("=") for kv in sys.argv[3:])}
    extra = {"train_samples": int(os.environ["TS"])} if "TS" in os.environ else {}
    config = build_config("2back", attn, "none", "smoke", attn_params=params, **extra)
    task = get_task(config.task)
    out = Path(os.environ.get("OUT", "/tmp/sieve_probes")) / "dyn"
    trainer = Trainer(config, task, torch.device("cpu"), out, progress=False)
    probe = torch.tensor(task.batch(np.arange(8), 64, split="test").input_ids)
    inner = trainer.step_fn
    seen = {"step": 0, "loss": [], "acc": []}

    def report() -> None:
        model = trainer.model
        was_training = model.training
        model.eval()
        parts = []
        with torch.no_grad():
            for index, (layer, x) in enumerate(zip(model.attention_layers, model.hidden_states(probe), strict=False)):
                tokens = x.shape[1]
                rows = torch.arange(tokens)
                q, k, _ = layer.project(x)
                z = layer.scores(q, k, rows)
                w = layer.weights(z, rows, x)
                _, earlier = diagonal_and_earlier(causal_mask(rows, tokens), rows)
                support = sieve_support(z, earlier, 1.5)
                r = rows[8:]
                spread = np.nanstd(torch.where(earlier, z, torch.nan)[:, :, 8:].numpy(), -1).mean()
                parts.append(f"L{index}: |S|={support.sum(-1).float()[:, :, 8:].mean():5.1f} "
                             f"P(r-1∈S)={support[:, :, r, r - 1].float().mean():.2f} "
                             f"maxhead w[r-1]={w[:, :, r, r - 1].mean((0, 2)).max():.2f} std_z={spread:5.2f}")
        model.train(was_training)
        loss = np.mean(seen["loss"][-every:]) if seen["loss"] else float("nan")
        acc = np.mean(seen["acc"][-every:]) if seen["acc"] else float("nan")
        print(f"step {seen['step']:4d} loss {loss:.3f} acc {acc:.3f} | " + " | ".join(parts), flush=True)

    def step(*args):
        if seen["step"] % every == 0:
            report()
        loss, correct, scored = inner(*args)
        seen["step"] += 1
        seen["loss"].append(loss.item())
        seen["acc"].append(correct.item() / max(1, scored.item()))
        return loss, correct, scored

    trainer.step_fn = step
    print(attn, params, flush=True)
    trainer.train()
    report()


if __name__ == "__main__":
    main()
