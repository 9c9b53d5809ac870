"""Score a trained run's weights with other attention mechanisms swapped in, no training.

Session 12 asked whether Sieve can use a circuit that stick-breaking learned (MQRAR's inline layout): the
mechanisms share every parameter, so the same weights run under each. Exact match and token accuracy per
mechanism and length, on the test split; then, per layer and head, how much of the trained mechanism's weight
falls on keys that each swapped mechanism gives no weight (for Sieve: keys outside the entmax support), on the
trained model's own hidden states, over the rows that predict a scored token.

    python benchmarks/init_probe/swap_eval.py --results /tmp/nope/r \
        --run mqrar-stickbreaking-none-smoke-s0-2ef538ac4f --attns stickbreaking,sieve,sieve-alg1 --lengths 16,32
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from lengthbench.runner import Evaluator, build_model, load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", required=True, help="results store holding the run's model.pt")
    parser.add_argument("--run", required=True, help="run id of the trained model")
    parser.add_argument("--attns", default="stickbreaking,sieve,sieve-alg1")
    parser.add_argument("--lengths", default="16,32")
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    model, task, config = load_model(args.results, args.run, args.device)
    print(f"weights: {args.run} ({config.attn} + {config.pe}, trained at n {config.train_length})")
    for attn in args.attns.split(","):
        swapped = build_model(dataclasses.replace(config, attn=attn), task).to(device)
        swapped.load_state_dict(model.state_dict())
        swapped.eval()
        evaluator = Evaluator(swapped, task, device, seed=config.seed)
        for n in map(int, args.lengths.split(",")):
            scores = evaluator.score(n, args.samples, split="test")
            print(f"{attn:14s} n {n:5d}: exact {100 * scores.exact_match:5.1f}%  token accuracy "
                  f"{100 * scores.token_accuracy:5.1f}%")
        if attn != config.attn:
            outside_mass(model, swapped, task, config, attn, int(args.lengths.split(",")[0]), device)


@torch.no_grad()
def outside_mass(model, swapped, task, config, attn: str, n: int, device, samples: int = 20) -> None:
    """Per layer and head: the mean weight of ``model``'s attention, at the rows whose next token is scored, on
    keys where ``swapped`` (same weights, other mechanism) puts none."""
    batch = task.batch(range(samples), n, split="test", seed=config.seed)
    totals = None
    for b in range(samples):
        ids = torch.as_tensor(batch.input_ids[b : b + 1], device=device)
        rows = torch.as_tensor((batch.labels[b] != -100).nonzero()[0], device=device)
        states = model.hidden_states(ids, None)
        per_layer = []
        for mine, theirs, x in zip(model.attention_layers, swapped.attention_layers, states, strict=True):
            w = mine.attention_map(x, rows)[0].float()
            w_other = theirs.attention_map(x, rows)[0].float()
            per_layer.append((w * (w_other <= 0)).sum(-1).mean(-1))  # [H]
        stacked = torch.stack(per_layer)  # [layers, H]
        totals = stacked if totals is None else totals + stacked
    mean = (totals / samples).cpu()
    for layer, heads in enumerate(mean):
        print(f"  {config.attn} weight on keys {attn} leaves out, layer {layer}: "
              + " ".join(f"{v:.2f}" for v in heads.tolist()))


if __name__ == "__main__":
    main()
