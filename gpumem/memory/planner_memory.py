"""Per-GPU bytes of one candidate layout: ZeRO over data parallelism, tensor and pipeline
parallelism, checkpointing, attention kernel and offload together (torch-free).

Layout. ``tp`` GPUs split every layer's matrices and the vocabulary (Megatron tensor
parallelism: column/row-parallel linears, a vocabulary-parallel embedding, head and loss);
RMSNorm weights are replicated. ``pp`` pipeline stages hold ceil(L / pp) layers each; the first
stage also holds the embedding, the last the final norm and the output head. ``dp = gpus /
(tp * pp)`` replicas of that split are the ranks ZeRO shards over (``accounting.model_states``
applied to the parameters of one tensor-and-pipeline rank).

Activations (``activations.activations`` on a stage of ceil(L / pp) layers):

* tensor parallelism with sequence parallelism (Korthikanti et al., arXiv:2205.05198, section 4.2.2):
  every saved activation, the logits included, is split over the ``tp`` GPUs: divided by ``tp``;
* pipeline parallelism with the 1F1B schedule (PipeDream-flush, Megatron's and DeepSpeed's
  default): stage i keeps the saved tensors of ``pp - i`` micro-batches in flight, so the first
  stage holds min(pp, micro-batches) micro-batches of its layers (it does not shrink with pp), and
  the last stage one micro-batch with the loss's logits.

Offload at ZeRO-2 and 3 moves the gradient partitions too: DeepSpeed copies each reduced
partition into an fp32 buffer on the host (or drive) next to the optimizer states, keeping only
the reduce bucket on the GPU (``accounting.model_states`` leaves the 16-bit gradients on the GPU;
DeepSpeed's own estimators do not). ZeRO-1 keeps full gradients until the step.

ZeRO-3 adds its working set (``accounting.zero3_gathered``: the largest module gathered, its full
gradient, the prefetch bucket) and the parameters DeepSpeed keeps whole on every rank because
they are below ``stage3_param_persistence_threshold`` (the norm weights). ZeRO's communication
buckets (``reduce_bucket_size``, ``allgather_bucket_size``) are counted as ``buffers``.
"""

from dataclasses import dataclass, replace
from functools import lru_cache

from . import accounting
from .activations import activations
from .models import ModelConfig

DS_BUCKET = 50_000_000        # elements: the reduce/all-gather bucket the planner's configs set
DS_PREFETCH = 50_000_000      # elements: stage3_prefetch_bucket_size (DeepSpeed's code default)


@dataclass(frozen=True)
class Layout:
    """One candidate: precision recipe, ZeRO stage, checkpoint policy, attention kernel, offload,
    micro-batch, and the tensor / pipeline / data parallel degrees."""
    recipe: str
    zero: int
    checkpoint: str
    attention: str
    offload: str
    device: str
    micro_batch: int
    tp: int
    pp: int
    dp: int
    n_micro: int          # micro-batches per step per data-parallel replica (gradient accumulation)

    def label(self) -> str:
        """A short name: ``mixed ZeRO-3 tp1 pp1 dp8 mb1 full flash``, with offload when used."""
        off = "" if self.offload == "none" else f" offload {self.offload}->{self.device}"
        return (f"{self.recipe} ZeRO-{self.zero} tp{self.tp} pp{self.pp} dp{self.dp} mb{self.micro_batch}"
                f" ckpt {self.checkpoint} {self.attention}{off}")


def layers_per_stage(cfg: ModelConfig, pp: int) -> int:
    """Layers of the largest pipeline stage: ceil(L / pp)."""
    return -(-cfg.n_layers // pp)


def local_params(cfg: ModelConfig, tp: int, pp: int) -> dict:
    """Parameters one GPU of the largest stage holds before ZeRO: its layers' matrices / tp,
    replicated norm weights, and the vocabulary matrices / tp on the first and last stage."""
    d, ls = cfg.d_model, layers_per_stage(cfg, pp)
    matrices = cfg.layer_params() - 2 * d
    layer = -(-matrices // tp) + 2 * d
    vocab = -(-cfg.vocab * d // tp)
    if pp == 1:
        return {"params": cfg.n_layers * layer + 2 * vocab + d, "norms": (2 * cfg.n_layers + 1) * d,
                "largest": max(vocab, -(-d * cfg.ffn // tp))}
    return {"params": ls * layer + vocab + d, "norms": (2 * ls + 1) * d,   # the last stage (head + final norm)
            "largest": max(vocab, -(-d * cfg.ffn // tp))}


def persistence_threshold(cfg: ModelConfig) -> int:
    """The ``stage3_param_persistence_threshold`` the planner's configs set: DeepSpeed's 1e5,
    lowered to d_model for small models so that, as in Llama-3, exactly the norm weights stay whole."""
    return min(100_000, cfg.d_model)


@lru_cache(maxsize=4096)
def _activations(cfg: ModelConfig, seq: int, mb: int, kernel: str, policy: str, recipe: str):
    return activations(cfg, seq, mb, kernel, policy, recipe)   # only the element size matters


def stage_activations(cfg: ModelConfig, seq: int, lay: Layout) -> dict:
    """Activation bytes of the first and the last pipeline stage for one GPU (see the module)."""
    stage = replace(cfg, n_layers=layers_per_stage(cfg, lay.pp)) if lay.pp > 1 else cfg
    a = _activations(stage, seq, lay.micro_batch, lay.attention, lay.checkpoint,
                     "fp32" if lay.recipe == "fp32" else "mixed")
    last = a.peak
    if lay.pp == 1:
        first = last
    else:
        in_flight = min(lay.pp, lay.n_micro)
        first = max(a.forward_peak - a.loss, a.recompute_peak) + (in_flight - 1) * a.layers
    return {"first": -(-first // lay.tp), "last": -(-last // lay.tp), "per_layer": a.per_layer}


def states_part(cfg: ModelConfig, lay: Layout) -> dict:
    """Model states, ZeRO-3 working set, persistent parameters and buffers of one GPU (bytes),
    independent of sequence and micro-batch."""
    lp = local_params(cfg, lay.tp, lay.pp)
    n = lp["params"]
    s = accounting.model_states(n, lay.recipe, lay.dp, lay.zero, lay.offload, lay.device)
    r = accounting.RECIPE[lay.recipe]
    gathered, persistent, buffers = 0, 0, 0
    if lay.zero == 3:
        prefetch = max(0, min(DS_PREFETCH, n - lp["largest"]))
        gathered = int(accounting.zero3_gathered(lp["largest"], lay.recipe, prefetch))
        if s.params:   # whole copies of the norm weights, beside the shards DeepSpeed keeps too
            persistent = r.params * lp["norms"]
        buffers = r.grads * min(DS_BUCKET, n)
    elif lay.zero in (1, 2):
        buffers = (r.grads + r.params) * min(DS_BUCKET, n)
    grads, host, nvme = s.grads, s.host, s.nvme
    if lay.offload != "none" and lay.zero >= 2:
        # DeepSpeed copies each reduced gradient partition into an fp32 buffer beside the
        # offloaded optimizer; the GPU keeps only the reduce bucket (its estimators: ZeRO-3 with
        # optimizer offload holds 2 psi / N on the GPU, 16 psi on the host)
        moved = (4 - max(0, r.grads - r.params)) * accounting.shard(n, lay.dp)   # mixed-ds: part moved already
        grads = 0
        host, nvme = (host + moved, nvme) if lay.device == "cpu" else (host, nvme + moved)
    return {"params": s.params + persistent, "grads": grads, "optimizer": s.optimizer,
            "gathered": gathered, "buffers": buffers, "host": host, "nvme": nvme,
            "local_params": n}


def per_gpu(cfg: ModelConfig, seq: int, lay: Layout, states: dict | None = None) -> dict:
    """Per-GPU bytes by part for the worse of the first and the last pipeline stage, with
    ``total``; ``states`` may be passed in when already computed for this layout."""
    st = states if states is not None else states_part(cfg, lay)
    acts = stage_activations(cfg, seq, lay)
    fixed = st["params"] + st["grads"] + st["optimizer"] + st["gathered"] + st["buffers"]
    worst = max(acts["first"], acts["last"])
    return {"params": st["params"], "grads": st["grads"], "optimizer": st["optimizer"],
            "zero3_working_set": st["gathered"], "buffers": st["buffers"], "activations": worst,
            "total": fixed + worst, "host": st["host"], "nvme": st["nvme"]}
