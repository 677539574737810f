"""Per-GPU bytes of one candidate layout: ZeRO over data parallelism, tensor and pipeline
parallelism, checkpointing, attention kernel and offload together (torch-free).

Layout. ``tp`` GPUs split every layer's matrices and the vocabulary (Megatron tensor
parallelism: column/row-parallel linears, a vocabulary-parallel embedding, head and loss);
RMSNorm weights are replicated. ``pp`` pipeline stages split the L layers as :func:`stage_layers`
says; the first stage also holds the embedding, the last the final norm and the output head.
``dp = gpus / (tp * pp)`` replicas of that split are the ranks ZeRO shards over
(``accounting.model_states`` applied to the parameters of one tensor-and-pipeline rank).

Uneven splits (pp does not divide L): :mod:`.stage_split` (the end stages hold one layer fewer,
as Llama 3's do). The fullest stage is counted (:func:`per_gpu`): the end stages together (the
last stage's parameters and the worse of the two stages' activations, as for even splits) and
the first middle stage of ceil(L / pp) layers, which keeps pp - i micro-batches in flight.

Activations (``activations.activations`` on a stage of ceil(L / pp) layers):

* tensor parallelism as DeepSpeed's AutoTP does it (no sequence parallelism: ``module_inject``
  has none; in training the output head is column-parallel with ``gather_output=True``, so every
  rank holds the full logits): of a layer's saved tensors, q/k/v, the attention output, the
  logsumexp and the MLP's gate/up/product are split over ``tp``; the two norms' inputs and the
  two projection inputs are whole on every rank. With flash in bf16 that is
  s*b*h*(8 + 32.5 / tp) per layer for Llama-3-70B (chapter 01's 40.5 s*b*h at tp = 1), plus the
  unsplit head input, final norm and logits (:func:`tp_activations`). DeepSpeed alone cannot
  split the rest;
* tensor x pipeline layouts are Megatron-DeepSpeed's (framework ``megatron-deepspeed``), planned
  with Megatron's sequence parallelism (arXiv:2205.05198, ``--sequence-parallel``): the norms'
  and projections' inputs are split along the sequence, the output head is vocabulary-parallel
  and the loss is computed on split logits, so every saved tensor is divided by ``tp``
  (Korthikanti et al.'s s*b*h*(34 + 5as/h)/t per layer);
* context parallelism (``cp``, Megatron-Core's ring attention): each rank holds ``seq / cp``
  tokens of every sequence, so every saved tensor is counted at the local sequence, plus the
  K/V chunks TransformerEngine's ring holds during one layer's attention
  (``context_parallel.ring_buffer_bytes``, added to the peak);
* interleaved 1F1B (``vp`` model chunks per rank): stage i holds
  ``schedules.interleaved_in_flight`` micro-batches of its layers (``p + (p - 1) / vp`` on the first);
* pipeline parallelism with the 1F1B schedule (PipeDream-flush, Megatron's and DeepSpeed's
  default): stage i keeps the saved tensors of ``pp - i`` micro-batches in flight, so the first
  stage holds min(pp, micro-batches) micro-batches of its layers (it does not shrink with pp), and
  the last stage one micro-batch with the loss's logits.

Expert parallelism (``ep`` > 1, a mixture of experts): :func:`.moe.model_states` (the experts
over dp / ep expert-data-parallel ranks, the rest over dp); activations unchanged (:mod:`.moe`).

Offload is ``accounting.model_states``'s, which follows DeepSpeed's allocations: the optimizer
states and an fp32 gradient partition go to the host (or drive); ZeRO-2 keeps only the reduce
bucket of gradients on the GPU, ZeRO-3 its 16-bit gradient partition in host memory, and ZeRO-1
the whole 16-bit gradient until the end-of-backward reduction.

ZeRO-3 adds its working set (``accounting.zero3_gathered``, the one definition: the steady
step's gathered parameters replayed for this rank's slice and stage, the largest module's full
gradient, and the reduce bucket the planner's configs set) and the parameters DeepSpeed keeps
whole on every rank because they are below ``stage3_param_persistence_threshold`` (the norm
weights). ZeRO-1/2's communication buckets (``reduce_bucket_size``, ``allgather_bucket_size``)
are counted as ``buffers``.
"""

import math
from bisect import bisect_left
from dataclasses import replace
from functools import lru_cache

from ..memory import accounting
from ..memory.activations import activations, layer_parts, norm_bytes, softmax_moment
from ..memory.models import ModelConfig
from ..memory.policies import checkpoint_plan
from ..timing import context_parallel, schedules
from . import hybrid, moe
from .layout import FRAMEWORK_3D, FRAMEWORK_FSDP2, FRAMEWORK_MCORE, Layout  # noqa: F401 (re-exported)
from .stage_split import middle_stage, split_text, stage_layers  # noqa: F401 (re-exported)

DS_BUCKET = 50_000_000        # elements: the reduce/all-gather bucket the planner's configs set
DS_PREFETCH = 50_000_000      # elements: stage3_prefetch_bucket_size (DeepSpeed's code default)


def layers_per_stage(cfg: ModelConfig, pp: int) -> int:
    """Layers of the largest pipeline stage: ceil(L / pp)."""
    return -(-cfg.n_layers // pp)


def local_params(cfg: ModelConfig, tp: int, pp: int, part: str | None = None) -> dict:
    """Parameters one GPU of a stage holds before ZeRO: its layers' matrices / tp, replicated
    norm weights, and the vocabulary matrices / tp on the first and last stage. ``part``:
    ``ends`` (the last stage, with the more layers of the two end stages), ``middle``
    (:func:`middle_stage`), or None: the stage with the most parameters."""
    d = cfg.d_model
    matrices = cfg.layer_params() - 2 * d
    layer = -(-matrices // tp) + 2 * d
    vocab = -(-cfg.vocab * d // tp)
    largest = max(vocab, -(-d * cfg.ffn // tp))
    if pp == 1:
        return {"params": cfg.n_layers * layer + 2 * vocab + d, "norms": (2 * cfg.n_layers + 1) * d,
                "largest": largest, "layers": cfg.n_layers}
    split, mid = stage_layers(cfg, pp), middle_stage(cfg, pp)
    ls = max(split[0], split[-1])
    ends = {"params": ls * layer + vocab + d, "norms": (2 * ls + 1) * d,   # the last stage (head + final norm)
            "largest": largest, "layers": ls}
    if mid is None or part == "ends":
        return ends
    middle = {"params": split[mid] * layer, "norms": 2 * split[mid] * d,
              "largest": -(-d * cfg.ffn // tp), "layers": split[mid]}
    return middle if part == "middle" or middle["params"] > ends["params"] else ends


def persistence_threshold(cfg: ModelConfig) -> int:
    """The ``stage3_param_persistence_threshold`` the planner's configs set: DeepSpeed's 1e5,
    lowered to d_model for small models so that, as in Llama-3, exactly the norm weights stay whole."""
    return min(100_000, cfg.d_model)


@lru_cache(maxsize=4096)
def _activations(cfg: ModelConfig, seq: int, mb: int, kernel: str, policy: str, recipe: str):
    return activations(cfg, seq, mb, kernel, policy, recipe)   # only the element size matters


# tensor groups AutoTP splits over its ranks (column-parallel outputs, row-parallel inputs)
TP_SPLIT = ("q, k, v", "output = W_o input", "logsumexp (fp32)", "q, k, v (core recomputed)", "W_o input",
            "q, expanded k and v", "probabilities", "gate, silu, up, product")


def _split(name: str) -> bool:
    return name.startswith(TP_SPLIT)


@lru_cache(maxsize=4096)
def tp_activations(cfg: ModelConfig, seq: int, mb: int, kernel: str, policy: str, recipe: str, tp: int,
                   sp: bool = False) -> dict:
    """Activation bytes of one tensor-parallel rank (fused norms): ``activations``' own accounting
    with each layer's split tensor groups divided by ``tp`` (AutoTP), or every tensor with
    ``sp`` (Megatron's sequence parallelism, see the module); keys ``peak``,
    ``forward_peak``, ``recompute_peak``, ``layers``, ``loss``, ``per_layer``, ``full_layer``."""
    a = _activations(cfg, seq, mb, kernel, policy, recipe)
    e = 4 if recipe == "fp32" else 2
    T, h, L = mb * seq, cfg.d_model, cfg.n_layers

    def layer(selective: bool) -> int:
        parts = layer_parts(cfg, seq, mb, kernel, e, selective=selective)
        return sum(-(-b // tp) if sp or _split(n) else b for n, b in parts.items())

    per_layer, full_layer = layer(policy == "selective"), layer(False)
    soft = softmax_moment(cfg, seq, mb, kernel, e)
    if soft and sp:
        soft = -(-soft // tp)
    elif soft:   # at the softmax: norm, projection input and the causal mask whole; heads split
        whole = norm_bytes(T, h, e) + e * T * h + seq * seq
        soft = whole + -(-(soft - whole) // tp)
    segments = checkpoint_plan(policy, L)
    in_segment = {i for seg in segments for i in seg}
    ckpt, rope = -(-e * T * h // (tp if sp else 1)), 2 * e * seq * cfg.head_dim
    outside, loss = a.outside, a.loss
    if sp:   # final norm and head input split along the sequence, logits along the vocabulary; RoPE's tables whole
        outside, loss = rope + -(-(a.outside - rope) // tp), -(-a.loss // tp)

    plain_before, starts = [0], sorted(seg[0] for seg in segments)   # prefix counts: O(L) once
    for j in range(L):
        plain_before.append(plain_before[-1] + (j not in in_segment))

    def saved_before(i: int) -> int:
        return plain_before[i] * per_layer + bisect_left(starts, i) * ckpt

    layers = saved_before(L)
    forward = layers + outside + loss
    if soft:
        forward = max(forward, saved_before(L - 1) + rope + soft)
    recompute = 0
    for seg in segments:   # the fused norm saves the segment input itself: counted once
        held = saved_before(seg[0]) + ckpt + rope + 8
        recompute = max(recompute, held + len(seg) * full_layer - ckpt,
                        held + (len(seg) - 1) * full_layer + soft - ckpt if soft else 0)
    if policy == "selective" and soft:
        recompute = saved_before(L - 1) + rope + soft + 8
    return {"peak": max(forward, recompute), "forward_peak": forward, "recompute_peak": recompute,
            "layers": layers, "loss": loss, "per_layer": per_layer, "full_layer": full_layer}


@lru_cache(maxsize=1024)
def _stage_cfg(cfg: ModelConfig, layers: int) -> ModelConfig:
    return replace(cfg, n_layers=layers)


def _stage_acts(cfg: ModelConfig, seq: int, lay: Layout, layers: int) -> dict:
    stage = _stage_cfg(cfg, layers) if lay.pp > 1 else cfg
    return tp_activations(stage, seq // lay.cp, lay.micro_batch, lay.attention, lay.checkpoint,
                          "fp32" if lay.recipe == "fp32" else "mixed", lay.tp, lay.sequence_parallel)


def stage_activations(cfg: ModelConfig, seq: int, lay: Layout) -> dict:
    """Activation bytes of the first and the last pipeline stage for one GPU (see the module),
    and of :func:`middle_stage` (``middle``, ``middle_stage``) when the split has one."""
    split = stage_layers(cfg, lay.pp)
    a = _stage_acts(cfg, seq, lay, split[-1])
    if lay.pp == 1:
        return {"first": a["peak"], "last": a["peak"], "per_layer": a["per_layer"], "split": split}

    def held(i: int) -> int:   # stage i < pp - 1 keeps min(pp - i, micro-batches) in flight (1F1B)
        s = _stage_acts(cfg, seq, lay, split[i])
        flight = (min(lay.pp - i, lay.n_micro) if lay.vp == 1
                  else schedules.interleaved_in_flight(lay.pp, lay.n_micro, lay.vp, i))
        return max(s["forward_peak"] - s["loss"], s["recompute_peak"]) + math.ceil((flight - 1) * s["layers"])

    out = {"first": held(0), "last": a["peak"], "per_layer": a["per_layer"], "split": split}
    mid = middle_stage(cfg, lay.pp)
    if mid is not None:
        out |= {"middle": held(mid), "middle_stage": mid}
    return out


def states_part(cfg: ModelConfig, lay: Layout, part: str = "ends") -> dict:
    """Model states, ZeRO-3 working set, persistent parameters and buffers of one GPU (bytes),
    independent of sequence and micro-batch, for the end stages or the ``middle`` stage; hybrid
    sharding's states are :func:`.hybrid.model_states` (hsdp: over ``group``; hpz: + its secondary copy)."""
    lp = local_params(cfg, lay.tp, lay.pp, part)
    n, r = lp["params"], accounting.RECIPE[lay.state_recipe]
    s = moe.model_states(cfg, n, lay) if lay.ep > 1 else hybrid.model_states(n, lay)   # ep: .moe
    gathered, persistent, buffers = 0, 0, 0
    if lay.zero == 3:   # the working set holds the reduce bucket (one definition, no buffers here)
        layers = lp["layers"] if lay.pp > 1 else None
        gathered = int(accounting.zero3_gathered(cfg, lay.recipe, DS_PREFETCH, DS_BUCKET, lay.tp, layers))
        if s.params:   # whole copies of the norm weights, beside the shards DeepSpeed keeps too
            persistent = r.params * lp["norms"]
    elif lay.zero in (1, 2) and lay.framework != FRAMEWORK_MCORE:   # DeepSpeed's buckets (Megatron-Core
        buffers = (r.grads + r.params) * min(DS_BUCKET, n)          # reduces its contiguous buffers in place)
    return {"params": s.params + persistent, "grads": s.grads, "optimizer": s.optimizer, "gathered": gathered,
            "buffers": buffers, "host": s.host, "nvme": s.nvme, "local_params": n}


def per_gpu(cfg: ModelConfig, seq: int, lay: Layout, states: dict | None = None, middle: dict | None = None,
            where: dict | None = None) -> dict:
    """Per-GPU bytes by part for the fullest pipeline stage (the end stages, or the middle stage
    of an uneven split), with ``total``; ``states`` (and ``middle``'s) may be passed in when
    already computed for this layout; ``where`` (a dict) gets ``stage`` (the fullest stage's
    index) and ``stage_layers``."""
    acts = stage_activations(cfg, seq, lay)
    split = acts["split"]
    ring = 0 if lay.cp == 1 else context_parallel.ring_buffer_bytes(   # TE's transient K/V chunks (cp > 1)
        cfg.d_model, cfg.n_heads, cfg.n_kv_heads, seq, lay.micro_batch, lay.tp, lay.cp,
        4 if lay.recipe == "fp32" else 2)["peak"]
    acts = acts | {k: acts[k] + ring for k in ("first", "last", "middle") if k in acts}
    cands = [(states if states is not None else states_part(cfg, lay), max(acts["first"], acts["last"]),
              0 if acts["first"] >= acts["last"] else lay.pp - 1)]
    if "middle" in acts:
        cands.append((middle if middle is not None else states_part(cfg, lay, "middle"), acts["middle"],
                      acts["middle_stage"]))
    best = None
    for st, worst, stage in cands:
        total = st["params"] + st["grads"] + st["optimizer"] + st["gathered"] + st["buffers"] + worst
        if best is None or total > best["total"]:
            best = {"params": st["params"], "grads": st["grads"], "optimizer": st["optimizer"],
                    "zero3_working_set": st["gathered"], "buffers": st["buffers"], "activations": worst,
                    "total": total, "host": st["host"], "nvme": st["nvme"]}
            if where is not None:
                where.update(stage=stage, stage_layers=split[stage])
    return best
