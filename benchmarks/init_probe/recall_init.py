"""Does a 2-layer decoder leave the associative-recall plateau? The same MQRAR batches to two models under two
initialisations (REPRODUCTION.md, session 5):

    gpt          a textbook pre-norm GPT (learned absolute positions, causal SDPA), PyTorch's default init
    gpt-init02   the same with every linear and embedding weight drawn from N(0, 0.02^2)
    rope         lengthbench's Decoder, softmax + RoPE, its default init (N(0, 0.02^2))
    rope-torch   the same with PyTorch's default init (``init = "torch"``)
    rope-embed   the default init, then the token embeddings redrawn from N(0, 1)

    python benchmarks/init_probe/recall_init.py rope-torch --steps 4000
    python benchmarks/init_probe/recall_init.py rope --steps 12000 --length 64 --layout separate --num-keys 16
    python benchmarks/init_probe/recall_init.py rope-torch --task mqmtar --length 64   # seed 003's recall task
    python benchmarks/init_probe/recall_init.py rope --task mqmtar --length 16 --key-tokens 1 --value-tokens 1

``--task mqmtar`` takes the same model through seed 003's MQMTAR (two-token keys and values, ``<kv>`` and
filler, queries then answers; ``--layout``, ``--num-keys`` and ``--queries`` do not apply; ``--key-tokens`` and
``--value-tokens`` set its key and value widths, 2 by default).

Defaults: the plain recall probe (n = 16: 8 assignments of mostly distinct keys, ``layout=inline``, 128 keys),
d 128, 4 heads, FFN 256, AdamW lr 1e-3 after 300 warm-up steps, batch 32, one CPU thread. Prints validation
exact match / token accuracy on 256 samples every 250 steps.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

from lengthbench.models.decoder import Decoder, ModelConfig
from lengthbench.tasks import get_task

VARIANTS = ("gpt", "gpt-init02", "rope", "rope-torch", "rope-embed")


class TextbookBlock(nn.Module):
    def __init__(self, d: int, heads: int, ffn: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, ffn), nn.GELU(), nn.Linear(ffn, d))

    def forward(self, x):
        batch, tokens, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, tokens, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        mixed = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(mixed.transpose(1, 2).reshape(batch, tokens, d))
        return x + self.mlp(self.norm2(x))


class TextbookGPT(nn.Module):
    def __init__(self, vocab: int, max_tokens: int, d: int, heads: int, ffn: int, layers: int):
        super().__init__()
        self.embed, self.position = nn.Embedding(vocab, d), nn.Embedding(max_tokens, d)
        self.blocks = nn.ModuleList(TextbookBlock(d, heads, ffn) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.embed(ids) + self.position(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build(variant: str, vocab: int, max_tokens: int, args) -> nn.Module:
    if variant.startswith("gpt"):
        model = TextbookGPT(vocab, max_tokens, args.d_model, args.heads, args.ffn, args.layers)
        if variant == "gpt-init02":
            for module in model.modules():
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(module.weight, std=0.02)
                    if getattr(module, "bias", None) is not None:
                        nn.init.zeros_(module.bias)
        return model
    init = "torch" if variant == "rope-torch" else "normal-0.02"
    model = Decoder(ModelConfig(vocab_size=vocab, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                                ffn=args.ffn, attn="softmax", pe="rope", init=init))
    if variant == "rope-embed":
        nn.init.normal_(model.embed.weight, std=1.0)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variant", choices=VARIANTS)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--task", default="mqrar", choices=("mqrar", "mqmtar"))
    parser.add_argument("--length", type=int, default=16)
    parser.add_argument("--layout", default="inline")
    parser.add_argument("--num-keys", type=int, default=128)
    parser.add_argument("--queries", type=int, default=4)
    parser.add_argument("--key-tokens", type=int, default=2, help="mqmtar only")
    parser.add_argument("--value-tokens", type=int, default=2, help="mqmtar only")
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", help="write the trained weights here (a curriculum's next stage reads them)")
    parser.add_argument("--init-from", help="start from weights written by --save (same model shapes)")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    if args.task == "mqrar":
        task = get_task("mqrar", layout=args.layout, num_keys=args.num_keys, queries=args.queries)
    else:
        task = get_task(args.task, key_tokens=args.key_tokens, value_tokens=args.value_tokens)
    tokens = task.batch(range(2), args.length).input_ids.shape[1]
    model = build(args.variant, task.vocab_size, 4 * tokens, args)
    if args.init_from:
        model.load_state_dict(torch.load(args.init_from))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    val = task.batch(range(256), args.length, "val")
    val_ids, val_labels = torch.from_numpy(val.input_ids).long(), torch.from_numpy(val.labels).long()
    started = time.time()
    print(f"{args.variant}: {vars(args)}", flush=True)
    for step in range(1, args.steps + 1):
        batch = task.batch(range((step - 1) * args.batch, step * args.batch), args.length)
        ids, labels = torch.from_numpy(batch.input_ids).long(), torch.from_numpy(batch.labels).long()
        for group in optimizer.param_groups:
            group["lr"] = 1e-3 * min(1.0, step / 300)
        logits = model(ids)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 250 == 0:
            with torch.no_grad():
                predicted = model(val_ids).argmax(-1)
            scored = val_labels >= 0
            exact = ((predicted == val_labels) | ~scored).all(-1).float().mean().item()
            accuracy = (predicted == val_labels)[scored].float().mean().item()
            print(f"{args.variant} step {step} loss {loss.item():.3f} validation exact {exact:.3f} "
                  f"token accuracy {accuracy:.3f} ({time.time() - started:.0f} s)", flush=True)
    if args.save:
        torch.save(model.state_dict(), args.save)


if __name__ == "__main__":
    main()
