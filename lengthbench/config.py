"""One typed run configuration, and the presets as named instances of its overrides."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from lengthbench.models import ARCHS, INITS
from lengthbench.store import RENAMED, SCHEMA_3_ATTN_PARAMS, SCHEMA_VERSION
from lengthbench.tasks import get_task

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
# Checkpoint selection: "id" (in-distribution validation, the default) or "Nx", validation at N times n_train for a
# power of two N >= 2 ("8x": the papers' protocol; "Long-Context Generalization with Sparse Attention"
# selects its RoPE models at 2x or 4x, by BLEU)
SELECTIONS = ("id", "2x", "4x", "8x", "16x")  # the usual ones, for messages; any power of two >= 2 is accepted
# What the selection compares: "task" (the task's own metric, the default), "exact_match", "token_accuracy" or
# "bleu" (corpus BLEU-4 of the answer tokens, the intermediate metric of "Long-Context Generalization with Sparse
# Attention" where exact match at 2x-8x stays 0)
SELECTION_METRICS = ("task", "exact_match", "token_accuracy", "bleu")


def selection_multiplier(selection: str) -> int:
    """``"id"`` -> 1, ``"8x"`` -> 8; a one-line ``ValueError`` for anything else."""
    if selection == "id":
        return 1
    match = re.fullmatch(r"([0-9]+)x", selection)
    factor = int(match.group(1)) if match else 0
    if factor < 2 or factor & (factor - 1):
        raise ValueError(f"unknown selection {selection!r}: id, or Nx for a power of two N >= 2 "
                         f"(e.g. {', '.join(SELECTIONS[1:])})")
    return factor


def selection_words(selection: str, metric: str) -> str:
    """How a checkpoint selection reads in labels and logs: ``"at 2x by bleu"``, ``"by token accuracy"``; ``""``
    for the default (in distribution, the task's metric)."""
    words = f"at {selection}" if selection != "id" else ""
    if metric != "task":
        words = f"{words} by {metric.replace('_', ' ')}".strip()
    return words


# ``INITS``, the decoder's weight initialisations: "normal-0.02" (the default) leaves a recall probe's plateau
# later than "torch" (4,000 against 2,250 steps) but its Copy + NAPE model holds to 16x-32x where "torch"'s
# fails from 2x on. ``ARCHS``: the decoder's block layouts ("prenorm", the default, or "gemma2").
DEFAULT_INIT = INITS[0]  # also what configurations stored before the field existed were trained with
# What --init-from carries over: every weight ("all"), or all but the token embedding and the output layer
# ("body": those keep their fresh initialisation, so the source run may have another vocabulary).
INIT_PARTS = ("all", "body")
# What the training step of a model with fused ops runs on CUDA: "fused", its Triton ops, the ones validation and
# scoring call; "reference", its dense references (the ``compiled`` step: compiled where the batches are narrow,
# the runner's ``trains_dense``). Two models trained on the references under the ``compiled`` step did not
# extrapolate, hence "fused" by default. Models without fused ops are unaffected.
TRAIN_ATTENTION = ("fused", "reference")
# How a training step runs on CUDA: "graph-compiled" (the default), the whole step (forward, backward, clipping,
# AdamW) in one CUDA graph at the task's widest training width, the attention on the ``train_attention`` path
# (fused ops with the launch settings a graph records, or dense references), the rest of the forward and backward
# compiled by Inductor at that one width (not with ``compile = False``), see lengthbench/graph_step.py; "graph",
# the same without Inductor (eager kernels in the graph: no compilation, slower steps); "compiled", torch.compile
# per bucket width where the model allows (see ``compile``, ``compile_mode``, ``train_attention``), else the fused
# ops eagerly. A CPU always trains eagerly. The default step's speed: results/benchmarks/train_throughput.md
# (``benchmarks/train_throughput.py --train-steps`` measures the others).
TRAIN_STEPS = ("graph-compiled", "graph", "compiled")
# Fields that a run's id hashes only where they differ from these defaults (see ``RunConfig.identity``).
OPTIONAL_FIELDS: dict[str, Any] = {"also_select": [], "selected_from": ""}
# The fields added after the first stored configurations: a stored configuration (a run's ``config_json``, a
# baseline's cell) may lack them, and reads as ``ABSENT_FIELDS`` or their defaults say; it has every other field.
LATER_FIELDS = ("init", "arch", "init_from", "init_part", "rescored_from", "compile_mode", "selection_metric",
                "train_attention", "train_step", *OPTIONAL_FIELDS)
# What a stored configuration that lacks a field (written before the field existed) ran with, where that is not
# the field's default: the configurations of the store's schema version 1 trained on the compiled step.
ABSENT_FIELDS = {"train_step": "compiled"}
# The names that an earlier schema version of the store gave other mechanisms (``store.RENAMED``)
RENAMED_NAMES = frozenset(name for names in RENAMED.values() for name in names)


@dataclass
class RunConfig:
    """Everything that defines a run. ``run_id`` hashes all of it except where it runs."""

    task: str
    attn: str
    pe: str
    seed: int = 0
    preset: str = "smoke"
    train_length: int = 64
    max_multiplier: int = 1024
    eval_samples: int = 1000
    task_params: dict[str, Any] = field(default_factory=dict)
    attn_params: dict[str, Any] = field(default_factory=dict)
    pe_params: dict[str, Any] = field(default_factory=dict)
    # model
    d_model: int = 256
    n_layers: int = 2
    n_heads: int = 8
    ffn: int = 512
    init: str = DEFAULT_INIT  # weight initialisation, one of INITS
    arch: str = "prenorm"  # block layout, one of ARCHS
    # a finished run of the same store (its run id) whose selected weights start this one: a curriculum, e.g.
    # two-token MQMTAR before single-token; its model must have this one's shapes. "" starts from ``init``.
    init_from: str = ""
    init_part: str = "all"  # one of INIT_PARTS
    # a run of the same store whose trained model this run scores again (``lengthbench rescore``: with other
    # evaluation samples or lengths); such a run trains nothing, its training fields are that run's. "" for a
    # run that trained its own model.
    rescored_from: str = ""
    # training
    train_samples: int = 10_000_000
    batch_size: int = 128
    lr: float = 1e-3
    warmup_steps: int = 10_000
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    selection: str = "id"
    selection_metric: str = "task"  # one of SELECTION_METRICS
    # more checkpoint selections kept from this one training (e.g. ["id"] beside selection "8x"): each is
    # validated at every ``eval_every`` steps too, and its best checkpoint is scored and stored as a run of its
    # own (``selected_runs``), so one training gives the rows of both selections
    also_select: list[str] = field(default_factory=list)
    # the run id of the training whose checkpoint of selection ``selection`` this run scores (a run of
    # ``selected_runs``); "" for a run that selected its own checkpoint
    selected_from: str = ""
    eval_every: int = 1000  # steps between checkpoint-selection evaluations
    val_samples: int = 256
    checkpoint_every: int = 500  # steps between resumable checkpoints
    compile: bool = True  # torch.compile on CUDA
    compile_mode: str = "default"  # torch.compile mode: default, reduce-overhead (CUDA graphs), max-autotune
    train_attention: str = "fused"  # one of TRAIN_ATTENTION
    train_step: str = "graph-compiled"  # one of TRAIN_STEPS
    # evaluation
    eval_tokens_per_batch: int = 0  # 0: adapt to free memory
    diagnostics: bool = True
    diagnostic_rows: int = 64  # query rows sampled per evaluation length for the attention diagnostics

    def __post_init__(self):
        selection_multiplier(self.selection)
        if isinstance(self.also_select, str) or not isinstance(self.also_select, list | tuple):
            raise ValueError(f"also_select takes a list of selections, got {self.also_select!r}")
        self.also_select = list(self.also_select)
        for other in self.also_select:
            selection_multiplier(other)
        if len(set(self.also_select)) != len(self.also_select) or self.selection in self.also_select:
            raise ValueError(f"also_select {self.also_select} repeats a selection (the run's own is "
                             f"{self.selection!r})")
        if self.selection_metric not in SELECTION_METRICS:
            raise ValueError(f"unknown selection metric {self.selection_metric!r}; choose from: "
                             f"{', '.join(SELECTION_METRICS)}")
        for name in ("train_length", "eval_samples", "train_samples", "batch_size", "d_model", "n_layers",
                     "n_heads", "ffn", "val_samples", "eval_every", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d-model {self.d_model} is not divisible by {self.n_heads} heads")
        if self.lr <= 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if self.init not in INITS:
            raise ValueError(f"unknown init {self.init!r}; choose from: {', '.join(INITS)}")
        if self.arch not in ARCHS:
            raise ValueError(f"unknown arch {self.arch!r}; choose from: {', '.join(ARCHS)}")
        if self.init_part not in INIT_PARTS:
            raise ValueError(f"unknown init part {self.init_part!r}; choose from: {', '.join(INIT_PARTS)}")
        if self.init_part != "all" and not self.init_from:
            raise ValueError("--init-part needs --init-from")
        if self.train_attention not in TRAIN_ATTENTION:
            raise ValueError(f"unknown train attention {self.train_attention!r}; choose from: "
                             f"{', '.join(TRAIN_ATTENTION)}")
        if self.train_step not in TRAIN_STEPS:
            raise ValueError(f"unknown train step {self.train_step!r}; choose from: {', '.join(TRAIN_STEPS)}")
        if self.compile_mode not in COMPILE_MODES:
            raise ValueError(f"unknown compile mode {self.compile_mode!r}; choose from: {', '.join(COMPILE_MODES)}")

    @property
    def train_steps(self) -> int:
        return max(1, -(-self.train_samples // self.batch_size))

    def identity(self) -> dict[str, Any]:
        """What ``run_id`` hashes: every field, except that fields of :data:`OPTIONAL_FIELDS` count only where
        they differ from their default (so adding one leaves the ids of the runs that do not use it unchanged;
        rows of the store's schema version 1 hashed fewer), and the store's schema version where ``attn`` is a
        name that an earlier version gave another mechanism (``sieve``: ``store.RENAMED``), so that a run of it
        never finds, resumes or counts as done a run of the other. A run of such a name that sets the parameters
        version 4 changed to what versions up to 3 left them at (``sieve``'s ``remainder="diagonal"``:
        ``store.SCHEMA_3_ATTN_PARAMS``) is the run those versions stored without them: version 3's identity."""
        values = dataclasses.asdict(self)
        for name, default in OPTIONAL_FIELDS.items():
            if values.get(name) == default:
                values.pop(name)
        if self.attn in RENAMED_NAMES:
            values["schema_version"] = SCHEMA_VERSION
            earlier = SCHEMA_3_ATTN_PARAMS.get(self.attn, {})
            if earlier and all(self.attn_params.get(key) == value for key, value in earlier.items()):
                values["attn_params"] = {key: value for key, value in self.attn_params.items() if key not in earlier}
                values["schema_version"] = 3
        return values

    def selected_runs(self) -> list[RunConfig]:
        """The runs of ``also_select``: this training's checkpoint of each other selection, scored as a run of
        its own (its ``selected_from`` is this run's id, its training fields this run's)."""
        return [dataclasses.replace(self, selection=other, also_select=[], selected_from=self.run_id)
                for other in self.also_select]

    @property
    def run_id(self) -> str:
        digest = hashlib.sha1(json.dumps(self.identity(), sort_keys=True, default=str).encode()).hexdigest()[:10]
        return f"{self.task}-{self.attn}-{self.pe}-{self.preset}-s{self.seed}-{digest}"

    def cell_name(self) -> str:
        """``"maxretrieval / entmax (alpha=4) + none / s0"``: the cell as the leaderboard names its row."""
        return (f"{self.task} / {self.attn}{params_suffix(self.attn_params)} + {self.pe}"
                f"{params_suffix(self.pe_params)} / s{self.seed}")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, default=str)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**ABSENT_FIELDS, **{k: v for k, v in data.items() if k in known}})


# Presets: what they change relative to the task's model in its paper (``Task.model_defaults``).
PRESETS: dict[str, dict[str, Any]] = {
    # A CPU minute per cell: a tiny model, a few thousand samples, lengths up to 8x.
    "smoke": dict(d_model=64, n_heads=4, ffn=128, max_layers=2, train_samples=24_000, batch_size=32,
                  lr=3e-3, warmup_fraction=0.05, eval_samples=64, val_samples=128, max_multiplier=8,
                  eval_every=250, checkpoint_every=250, compile=False, diagnostic_rows=16),
    # Minutes on one GPU: the papers' model shapes, 2M samples, 200 evaluation samples per length.
    "quick": dict(train_samples=2_000_000, batch_size=256, lr=1e-3, warmup_fraction=0.05, eval_samples=200,
                  val_samples=512, max_multiplier=1024, eval_every=1000, checkpoint_every=1000),
    # The papers' protocol: their model sizes and sample counts, batch 128, 10K warm-up steps,
    # 1,000 evaluation samples per length.
    # At batch 128 the paper MQMTAR model is launch-bound: CUDA graphs (``reduce-overhead``) took its training
    # step from 15.1k to 28.9k samples/s on an H100, and a whole run with them (validation, checkpoints) ran
    # there (results/spine/README.md). Models that call fused Triton ops fall back to the default mode.
    "paper": dict(batch_size=128, lr=1e-3, warmup_steps=10_000, eval_samples=1000, val_samples=1000,
                  max_multiplier=1024, eval_every=5000, checkpoint_every=5000, compile_mode="reduce-overhead"),
}


def preset_warmup(preset: str, train_samples: int, batch_size: int) -> int | None:
    """The warm-up steps ``preset`` gives a run of this budget: its fixed count (``paper``), or its fraction of
    the steps (``quick``, ``smoke``); None for an unknown preset."""
    values = PRESETS.get(preset)
    if values is None:
        return None
    if "warmup_fraction" in values:
        return max(1, int(values["warmup_fraction"] * -(-train_samples // batch_size)))
    return values.get("warmup_steps", RunConfig.warmup_steps)


def build_config(task: str, attn: str, pe: str, preset: str = "smoke", **overrides: Any) -> RunConfig:
    """The configuration of a run: the task's model in its paper, then the preset, then explicit overrides
    (``None`` values are ignored)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from: {', '.join(PRESETS)}")
    task_obj = get_task(task, **(overrides.get("task_params") or {}))
    defaults = task_obj.model_defaults
    values: dict[str, Any] = dict(
        d_model=defaults.d_model, n_layers=defaults.layers, n_heads=defaults.heads, ffn=defaults.ffn,
        train_samples=defaults.train_samples, batch_size=defaults.batch_size,
    )
    preset_values = dict(PRESETS[preset])
    max_layers = preset_values.pop("max_layers", None)
    warmup_fraction = preset_values.pop("warmup_fraction", None)
    values.update(preset_values)
    if max_layers is not None:
        values["n_layers"] = min(values["n_layers"], max_layers)
    values.update({k: v for k, v in overrides.items() if v is not None})
    if warmup_fraction is not None and overrides.get("warmup_steps") is None:
        values["warmup_steps"] = preset_warmup(preset, values["train_samples"], values["batch_size"])
    from lengthbench.models.attention import ATTENTION
    from lengthbench.models.positional import POSITIONAL_ENCODINGS
    from lengthbench.tasks import TASKS  # canonical names, so aliases share run ids

    return RunConfig(task=TASKS.canonical(task), attn=ATTENTION.canonical(attn),
                     pe=POSITIONAL_ENCODINGS.canonical(pe), preset=preset, **values)


def parse_params(items: list[str], flag: str = "--param") -> dict[str, Any]:
    """``key=value`` pairs; values are read as JSON where they parse (numbers, booleans), else strings."""
    from lengthbench.errors import UsageError

    params = {}
    for item in items:
        if "=" not in item:
            raise UsageError(f"{flag} takes key=value, got {item!r}")
        key, value = item.split("=", 1)
        try:
            params[key.strip().replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            params[key.strip().replace("-", "_")] = value
    return params


def params_suffix(params) -> str:
    """``" (alpha=4, k=2)"`` for a run's given mechanism or encoding parameters; ``""`` for none."""
    if not isinstance(params, dict) or not params:
        return ""
    text = ", ".join(f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}"
                     for key, value in sorted(params.items()))
    return f" ({text})"
