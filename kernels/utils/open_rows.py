"""The rows a first stage leaves open: gathered per head, counted on the host without a wait, and gathered
again between phases. Not an op; shared by the entmax search (``entmax/threshold.py``) and Sieve (``sieve/``).

Few open rows (``few_open``: at least ``few_open[1]`` tokens and at most ``few_open[0]`` open rows a
multiprocessor, all heads together): the open rows' kernels may take tiles of their own (``newton_few``,
``sieve_open_few``; None: their usual ones). Such rows all run at once, and the last rows' walk over every key
is then the critical path, which smaller tiles shorten; with many open rows larger tiles share each key tile
among more rows. Their count comes to the host behind the first stage (``_OpenCount``).

Many open rows (``newton_phases``, ``sieve_phases``, from ``phases_from`` tokens): a tile of gathered open
rows runs as long as its slowest row, so the rows still going are gathered again between launches, the Newton
kernel's after 2 passes (``threshold._newton_launch``), Sieve's open walk after 512, 2,048 and 8,192 keys
(``sieve._open_walk``, the walk's state kept in the row's unused list slots). A row census of a trained MQMTAR
Sieve + NoPE model (H100, 65,536 tokens) found its open rows (23%) open for ties: supports of 261 keys
(median; 9,011 at p90) with 2 distinct values (a NoPE model scores a key by its token alone in its first
layer), not certifiable by a column's top 4 and too many for the lists; their walks end 2,149 keys back
(median) but 35,897 at p90, and every 64-row tile holds such a row. That model's sample took 206.7 ms in one
launch each, 163.5 ms with both phases; 1,000 samples 150 s instead of 196 (1.80x softmax + RoPE's 83 s).
"""

from __future__ import annotations

import torch

_PINNED: dict = {}  # a pinned host int64 a device, for _OpenCount's copy
_SMS: dict = {}  # multiprocessors a device


class _OpenCount:
    """Whether a launch's open rows (``count`` [BH], ``_open_rows``) are few (``few_open``): their total is
    copied to a pinned host buffer behind the kernels queued so far, without waiting, and read at the first
    :meth:`few`, which waits for that copy only (the kernels queued after it keep the device busy). Never read
    (always not few) off CUDA, below ``few_open[1]`` tokens, while a CUDA graph is captured, or without
    ``few_open``."""

    def __init__(self, count: torch.Tensor, tokens: int, config: dict):
        self._few, self._event, self._limit = False, None, 0
        setting = config.get("few_open")
        if not setting or not count.is_cuda or tokens < int(setting[1]):
            return
        if torch.cuda.is_current_stream_capturing():
            return
        device = count.device
        if device not in _PINNED:
            _PINNED[device] = torch.empty((), dtype=torch.int64, pin_memory=True)
            _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count
        self._limit = int(setting[0]) * _SMS[device]
        self._host = _PINNED[device]
        self._host.copy_(count.sum(dtype=torch.int64), non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()

    def few(self) -> bool:
        if self._event is not None:
            self._event.synchronize()
            self._few, self._event = int(self._host) <= self._limit, None
        return self._few


# _row_cumsum's chunk: one scan along rows this long, one along the chunks' totals
_SCAN_CHUNK = 256


def _row_cumsum(flags: torch.Tensor) -> torch.Tensor:
    """``torch.cumsum(flags, 1)`` as int32, for ``[BH, T]`` with few rows and long ones: in chunks of
    ``_SCAN_CHUNK`` and then over the chunks' totals. A scan along a long innermost dimension takes a block a row
    (84 us for 16 rows of 65,536 on the H100); chunked, the rows' work is spread over many blocks."""
    heads, tokens = flags.shape
    if tokens <= 4 * _SCAN_CHUNK:
        return torch.cumsum(flags, 1, dtype=torch.int32)
    chunks = -(-tokens // _SCAN_CHUNK)
    padded = torch.zeros(heads, chunks * _SCAN_CHUNK, device=flags.device, dtype=torch.int32)
    padded[:, :tokens] = flags
    inner = torch.cumsum(padded.view(heads, chunks, _SCAN_CHUNK), 2, dtype=torch.int32)
    totals = inner[:, :, -1]
    inner += (torch.cumsum(totals, 1, dtype=torch.int32) - totals).unsqueeze(2)  # the chunks before each
    return inner.view(heads, -1)[:, :tokens]


def _open_rows(done: torch.Tensor):
    """The rows left open (``done == 0``) per head, gathered in order: ``(rows [BH, T + 1] int32, count [BH]
    int32)``, ``rows[bh, :count[bh]]`` the open rows of head ``bh`` (the last column takes the others). On the
    device, no synchronisation."""
    heads, tokens = done.shape
    open_ = done == 0
    slot = torch.where(open_, _row_cumsum(open_) - 1, tokens)
    rows = torch.zeros(heads, tokens + 1, device=done.device, dtype=torch.int32)
    order = torch.arange(tokens, device=done.device, dtype=torch.int32).expand(heads, tokens)
    rows.scatter_(1, slot.long(), order)
    return rows, open_.sum(1, dtype=torch.int32)


def _phases(config: dict, key: str, tokens: int) -> list[int]:
    """The phases of ``config[key]`` (``newton_phases``, ``sieve_phases``) at ``tokens``: none below
    ``phases_from`` tokens (short rows: a launch more costs more than it saves)."""
    if tokens < int(config.get("phases_from") or 0):
        return []
    return [int(p) for p in (config.get(key) or ())]
