"""Why rows stay open: a census of sampled rows of one ``kernels/entmax.py`` list forward (entmax, Sieve).

For each sampled row it recomputes the row's scores against every key it sees (``X = xs z``, as the kernels
do: ``sm_scale``, slopes and row scale), in float64, and records:

- ``support``: the exact support of 1.5-entmax (``xs`` 0.5) or sparsemax (``xs`` 1) over ``X``, and
  ``distinct`` the distinct values in it (ties: a NoPE model's first layer scores a key by its token alone);
- the first stage as the kernel runs it, without packing or margins: the top 4 of every column (``j mod
  bns``), ``tau_sub`` their threshold, ``saturated`` the columns whose 4th value lies above it, ``certified``
  none saturated (or at most 4 keys a column), ``candidates`` the kept values above ``tau_sub``, and
  ``rescue_candidates`` those of the unsaturated columns plus every key of the saturated ones above it;
- ``newton``: the lean Newton passes from ``tau_sub`` to ``tau*`` (``kernels/entmax.py``'s step, ``tol``);
- ``span``: how far back the support reaches (``r - min j``); ``walk``: how far back Sieve's open walk goes
  (``kernels/sieve.py``: from the diagonal back until the support's ``softplus(z)`` sum passes ``EXIT_AT``,
  60 nats; the row itself where it never does);
- ``listed``: what the kernel did (``NCAND > 0``).

``benchmarks/kernel_breakdown.py --census N`` runs it on N rows a head of every list forward of a model's
evaluation sample. Pure torch: it runs wherever the inputs are.
"""

from __future__ import annotations

import torch


def threshold(x: torch.Tensor, xs: float) -> torch.Tensor:
    """The exact threshold of each row of ``x`` ``[R, n]`` (float64, ``-inf`` for absent keys):
    ``sum (x - t)_+^2 = 1`` (``xs`` 0.5, 1.5-entmax) or ``sum (x - t)_+ = 1`` (``xs`` 1, sparsemax)."""
    srt = torch.sort(x, dim=1, descending=True).values
    finite = torch.isfinite(srt)
    vals = torch.where(finite, srt, torch.zeros_like(srt))
    k = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype)
    cs = torch.cumsum(vals, 1)
    if xs == 1.0:
        t = (cs - 1) / k
    else:
        cs2 = torch.cumsum(vals * vals, 1)
        delta = (1 - (cs2 - cs * cs / k)) / k
        t = cs / k - torch.sqrt(delta.clamp_min(0))
    # the support size: the largest k whose threshold lies below the k-th value
    ok = finite & (t < srt)
    size = ok.sum(1).clamp_min(1)
    return t.gather(1, (size - 1)[:, None])[:, 0]


def newton_passes(x: torch.Tensor, tau: torch.Tensor, xs: float, tol: float = 1e-6, max_iter: int = 40):
    """The passes the lean Newton search takes from ``tau`` (below the root) to move by less than ``tol``."""
    passes = torch.zeros(x.shape[0], dtype=torch.int64, device=x.device)
    active = torch.ones_like(passes, dtype=torch.bool)
    for _ in range(max_iter):
        if not active.any():
            break
        s = (x - tau[:, None]).clamp_min(0)
        s = torch.where(torch.isfinite(s), s, torch.zeros_like(s))
        s1 = s.sum(1)
        if xs == 1.0:
            cnt = (s > 0).sum(1).to(x.dtype)
            step = (s1 - 1) / cnt.clamp_min(1)
        else:
            s2 = (s * s).sum(1)
            step = (s2 - s2.sqrt()) / s1.clamp_min(1e-300)
        passes += active.long()
        new = torch.where(active, tau + step, tau)
        active = active & (step.abs() >= tol)
        tau = new
    return passes


def census(q, k, ncand, *, xs: float, strict: bool, sm_scale: float, slopes=None, row_scale=None, bns: int = 64,
           size: int = 64, max_sat: int = 4, rows: int = 32, seed: int = 0, chunk: int = 64,
           exit_at: float = 60.0) -> list[dict]:
    """The census of ``rows`` sampled rows a head: ``q, k`` ``[B, H, T, D]``, ``ncand`` ``[B H, T]`` (the
    kernel's), the launch's ``bns`` (first-stage columns), ``size`` (list slots) and ``max_sat``."""
    batch, heads, tokens, _ = q.shape
    gen = torch.Generator(device="cpu").manual_seed(seed)
    first = 1 if strict else 0  # the rows that see at least one key
    out = []
    for bh in range(batch * heads):
        b, h = divmod(bh, heads)
        picked = torch.randperm(tokens - first, generator=gen)[:rows] + first
        picked, _ = torch.sort(picked)
        keys = k[b, h].double()
        for start in range(0, len(picked), chunk):
            r = picked[start:start + chunk].to(q.device)
            z = (q[b, h, r].double() @ keys.T) * sm_scale
            j = torch.arange(tokens, device=q.device)
            if slopes is not None:
                z = z - float(slopes.reshape(-1)[h]) * (r[:, None] - j[None, :]).double()
            if row_scale is not None:
                z = z * row_scale.expand(batch, heads, tokens)[b, h, r].double()[:, None]
            seen = (j[None, :] < r[:, None]) if strict else (j[None, :] <= r[:, None])
            x = torch.where(seen, z * xs, torch.full_like(z, float("-inf")))
            tau = threshold(x, xs)
            supp = x > tau[:, None]
            # the first stage: the top 4 of every column c = j mod bns
            pad = (-tokens) % bns
            cols = torch.nn.functional.pad(x, (0, pad), value=float("-inf")).view(len(r), -1, bns)
            depth = min(4, cols.shape[1])
            top = torch.topk(cols, depth, dim=1).values  # [R, depth, bns]
            tau_sub = threshold(top.reshape(len(r), -1), xs)
            n_keys = seen.sum(1)
            sat = (top[:, -1, :] > tau_sub[:, None]) & (n_keys > 4 * bns)[:, None]
            n_sat = sat.sum(1)
            kept = top > tau_sub[:, None, None]
            cand = kept.sum((1, 2))
            rescue = (kept & ~sat[:, None, :]).sum((1, 2)) + ((cols > tau_sub[:, None, None]) & sat[:, None, :]).sum((1, 2))
            passes = newton_passes(x, tau_sub, xs)
            span = torch.where(supp, r[:, None] - j[None, :], torch.zeros_like(z, dtype=torch.long)).amax(1)
            # the stick's log decay from the diagonal back: softplus(z) summed over the support, nearest first
            decay = torch.flip(torch.cumsum(torch.flip(torch.where(supp, torch.nn.functional.softplus(z),
                                                                    torch.zeros_like(z)), [1]), 1), [1])
            spent = supp & (decay > exit_at)
            last = torch.where(spent, j[None, :], torch.full_like(z, -1, dtype=torch.long)).amax(1)
            walk = torch.where(last >= 0, r - last, r)
            for i in range(len(r)):
                row = int(r[i])
                s_vals = x[i][supp[i]]
                out.append(dict(bh=bh, row=row, keys=int(n_keys[i]), listed=bool(ncand[bh, row] > 0),
                                support=int(supp[i].sum()), distinct=int(torch.unique(s_vals).numel()),
                                saturated=int(n_sat[i]), certified=bool(n_sat[i] == 0),
                                candidates=int(cand[i]), rescue_candidates=int(rescue[i]),
                                newton=int(passes[i]), span=int(span[i]), walk=int(walk[i]),
                                fits=bool((n_sat[i] == 0 and cand[i] <= size)
                                          or (0 < n_sat[i] <= max_sat and rescue[i] <= size))))
    return out


def summary(frame) -> str:
    """A few lines on the census ``frame`` (one row a sampled row): listed and open rows side by side."""
    lines = []
    for listed, part in frame.groupby("listed"):
        name = "listed" if listed else "open"
        q = part[["support", "distinct", "saturated", "candidates", "rescue_candidates", "newton", "span", "walk"]]
        lines.append(f"{name}: {len(part)} rows ({len(part) / len(frame):.1%}); median / p90:")
        for col in q.columns:
            lines.append(f"  {col:18s} {q[col].median():10.1f} {q[col].quantile(0.9):10.1f}")
        if not listed:
            lines.append(f"  support <= 64: {(part['support'] <= 64).mean():.1%}, <= 128: "
                         f"{(part['support'] <= 128).mean():.1%}, <= 512: {(part['support'] <= 512).mean():.1%}; "
                         f"certified: {part['certified'].mean():.1%}; the model says fits: {part['fits'].mean():.1%}; "
                         f"ties (distinct < support): {(part['distinct'] < part['support']).mean():.1%}")
    return "\n".join(lines)
