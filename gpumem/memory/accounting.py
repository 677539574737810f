"""Model-state accounting: bytes per parameter by recipe, sharded by ZeRO, optionally offloaded.

Recipes (per parameter):

=========  ======  =====  =============================  =====
recipe     params  grads  optimizer                      total
=========  ======  =====  =============================  =====
pure-bf16  2       2      m 2 + v 2                      8
mixed      2       2      fp32 master 4 + m 4 + v 4      16
mixed-ds   2       4      fp32 master 4 + m 4 + v 4      18   (fp32 grads instead of bf16; DeepSpeed's ZeRO-3 estimator: 18 B)
fp32       4       4      m 4 + v 4                      16
=========  ======  =====  =============================  =====

Mixed precision does not shrink model states: fp32 (4+4+8) and bf16-mixed (2+2+12) are both 16.
ZeRO (arXiv:1910.02054) shards optimizer states (stage 1), then gradients (2), then parameters
(3) over N data-parallel ranks; each rank holds ceil(Psi / N) elements of a sharded state.
At stage 3 a rank also holds a working set beyond its shards: the gathered parameters of the
module it runs, that module's full gradient and the prefetch bucket (:func:`zero3_gathered`).

Offload (``offload_optimizer`` / ``offload_param``) follows DeepSpeed 0.19.8's allocations, per GPU,
mixed recipe, s = ceil(Psi / N) (:func:`model_states` cites the lines):

=======================  ======================  ==================  =================
stage + offload          GPU                     host                NVMe
=======================  ======================  ==================  =================
ZeRO-1, optimizer cpu    2 Psi + 2 Psi grads     16 s                0
ZeRO-2, optimizer cpu    2 Psi                   16 s                0
ZeRO-3, optimizer cpu    2 s                     18 s                0
ZeRO-3, optimizer nvme   2 s                     2 s                 16 s
ZeRO-3, opt+params cpu   0                       20 s                0
ZeRO-3, opt+params nvme  0                       2 s                 18 s
=======================  ======================  ==================  =================

(16 s = fp32 master, m, v and the fp32 gradient the CPU Adam reads; ZeRO-3 adds its 16-bit
gradient partition, 2 s, which DeepSpeed allocates in host memory whenever it offloads.)
"""

from dataclasses import dataclass, field
from functools import lru_cache

from ..errors import UsageError, one_of, positive_int
from . import zero3_schedule
from .models import with_layers

RECIPES = ("pure-bf16", "mixed", "mixed-ds", "fp32")
OFFLOADS = ("none", "optimizer", "optimizer+params")
DEVICES = ("cpu", "nvme")


@dataclass(frozen=True)
class Recipe:
    """The bytes per parameter one precision recipe spends on parameters, gradients and optimizer states."""
    name: str
    params: int
    grads: int
    optimizer: tuple[tuple[str, int], ...]
    about: str
    step_counter: bool   # torch.optim.AdamW keeps a 4-byte fp32 step tensor per parameter tensor

    @property
    def optimizer_bytes(self) -> int:
        return sum(b for _, b in self.optimizer)

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer_bytes


RECIPE = {r.name: r for r in [
    Recipe("pure-bf16", 2, 2, (("m bf16", 2), ("v bf16", 2)),
           "everything in bf16, no master copy (the note's 4 B optimizer figure)", True),
    Recipe("mixed", 2, 2, (("master fp32", 4), ("m fp32", 4), ("v fp32", 4)),
           "bf16 weights and grads, fp32 master and moments (ZeRO paper, K = 12)", False),
    Recipe("mixed-ds", 2, 4, (("master fp32", 4), ("m fp32", 4), ("v fp32", 4)),
           "as mixed, with fp32 gradients instead of bf16 ones: DeepSpeed's ZeRO-3 estimator's 18 B", False),
    Recipe("fp32", 4, 4, (("m fp32", 4), ("v fp32", 4)),
           "no mixed precision at all", True),
]}


def recipe(name: str) -> Recipe:
    """Look up a recipe by name; a UsageError lists the accepted names."""
    return RECIPE[one_of(name, RECIPES, "recipe")]


def recipe_table() -> str:
    """The per-recipe bytes-per-parameter table, rendered."""
    lines = [f"{'recipe':10s} {'params':>6s} {'grads':>6s} {'optimizer':>10s} {'total':>6s}  optimizer holds"]
    for r in RECIPE.values():
        parts = " + ".join(f"{label} {b}" for label, b in r.optimizer)
        lines.append(f"{r.name:10s} {r.params:>5d}B {r.grads:>5d}B {r.optimizer_bytes:>9d}B {r.total:>5d}B  {parts}")
    return "\n".join(lines)


@dataclass
class States:
    """Model-state bytes held by one GPU, plus what was offloaded (per GPU)."""
    params: int
    grads: int
    optimizer: int
    host: int = 0
    nvme: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


def check_offload(zero: int, offload: str, device: str) -> None:
    """Refuse the offload combinations DeepSpeed 0.19.8 does not have (UsageError, one line).

    DeepSpeed reads ``offload_optimizer`` only inside its ZeRO optimizers (stage 1, 2 or 3:
    ``zero_enabled = stage > 0``), so at stage 0 the setting is silently ignored; ``offload_param``
    exists only at stage 3; NVMe is a stage-3 feature (stages 1 and 2 treat any offload device
    as CPU memory); and a device without anything offloaded means nothing.
    """
    if offload != "none" and zero == 0:
        raise UsageError(f"--offload {offload} needs ZeRO stage 1, 2 or 3 (DeepSpeed ignores "
                         "offload_optimizer at stage 0); accepted with --zero 0: --offload none")
    if offload == "optimizer+params" and zero != 3:
        raise UsageError("offloading parameters needs ZeRO stage 3 (--zero 3); accepted with "
                         "--zero 1-2: --offload none or optimizer")
    if device == "nvme" and offload == "none":
        raise UsageError("--offload-device nvme with --offload none offloads nothing; accepted: "
                         "--offload optimizer or optimizer+params with --zero 3")
    if device == "nvme" and zero != 3:
        raise UsageError("NVMe offload needs ZeRO stage 3 (--zero 3); with --zero 1-2 use --offload-device cpu")


def shard(n: int, ranks: int) -> int:
    """Elements one rank holds when ``n`` elements are split evenly (last shard padded)."""
    return -(-n // ranks)


def model_states(n_params: int, recipe_name: str = "mixed", gpus: int = 1, zero: int = 0,
                 offload: str = "none", device: str = "cpu", n_tensors: int = 0) -> States:
    """Per-GPU bytes of parameters, gradients and optimizer states, and what offload puts on the
    host (``host``) or the drive (``nvme``), per GPU.

    ``n_tensors`` (parameter tensors in the model) adds torch AdamW's 4-byte step counters where
    the recipe uses ``torch.optim.AdamW``; leave it 0 for paper-style accounting.

    Offload follows what DeepSpeed 0.19.8 allocates (``deepspeed/runtime/zero/``), with s =
    ceil(Psi / N), p16 the bytes of the parameters' dtype (2, or 4 for fp32) and g the bytes of
    the gradient the optimizer reads (4 with an fp32 master or in fp32; 2 for pure-bf16):

    * every offloading stage moves the optimizer states and hands the optimizer its own gradient
      partition of g x s bytes beside them (``.grad`` of the fp32 partition, allocated on the
      offload device: ``stage_1_and_2.py`` 278 and 934-944, ``stage3.py`` 1342-1344; CPU Adam reads it);
    * ZeRO-1 and 2 (``stage_1_and_2.py``) keep the whole 16-bit parameters on the GPU. ZeRO-2's
      gradient hooks copy each reduced bucket's own slice straight into that host gradient
      (``async_inplace_copy_grad_to_fp32_buffer_from_gpu``, 1888-1912) and drop it: the GPU keeps
      only the reduce buckets (buffers, not model states), no gradient partition. ZeRO-1's hooks
      reduce nothing without ``overlap_comm`` (2290); it reduces at the end of backward
      (``engine.py`` 3092 -> ``reduce_gradients``, 958): the full p16 x Psi gradient is on the GPU
      until then, so it is counted (chapter 05's run measures it);
    * ZeRO-3 (``stage3.py``) allocates its 16-bit gradient partition (``grad_partitions_flat_buffer``,
      p16 x s) on ``self.device``, which is the CPU whenever the optimizer is offloaded (lines 333
      and 791-795), also with NVMe (it is never swapped): the GPU keeps the parameter shard only
      (plus the working set, :func:`zero3_gathered`); parameter offload moves that shard too;
    * on NVMe (stage 3) the optimizer states, the optimizer's gradient and offloaded parameters go
      to swap files (the 16-bit gradient partition stays in host memory).

    So with the mixed recipe: ZeRO-1/2 keep 2 Psi (+ 2 Psi of gradients at ZeRO-1) on the GPU and
    16 s on the host; ZeRO-3 keeps 2 s on the GPU and 18 s on the host (DeepSpeed's estimators say
    16: they leave out the 16-bit partition). ``mixed-ds`` differs from ``mixed`` only in counting an
    fp32 gradient instead of a bf16 one; offloaded, both describe the same run, and give the same
    bytes. pure-bf16 has no fp32 anywhere (DeepSpeed itself always builds an fp32 master; this is a
    what-if with DeepSpeed's buffers in bf16): its optimizer reads a bf16 gradient copy, g = 2.
    """
    n_params = positive_int(n_params, "parameter count")
    gpus = positive_int(gpus, "GPU count")
    if zero not in (0, 1, 2, 3):
        raise UsageError(f"ZeRO stage must be 0, 1, 2 or 3, got {zero!r}")
    one_of(offload, OFFLOADS, "offload")
    one_of(device, DEVICES, "offload device")
    r = recipe(recipe_name)
    check_offload(zero, offload, device)
    p_elems = shard(n_params, gpus) if zero >= 3 else n_params
    g_elems = shard(n_params, gpus) if zero >= 2 else n_params
    o_elems = shard(n_params, gpus) if zero >= 1 else n_params
    counters = 4 * n_tensors if r.step_counter else 0
    s = States(params=r.params * p_elems, grads=r.grads * g_elems,
               optimizer=r.optimizer_bytes * o_elems + counters)
    if offload == "none":
        return s
    sh = shard(n_params, gpus)
    g_opt = optimizer_grad_bytes(r)
    to_device = s.optimizer + g_opt * sh      # optimizer states and the optimizer's gradient
    host = 0
    s.optimizer = 0
    s.notes.append(f"optimizer states and a {g_opt} B/param gradient partition for the CPU optimizer "
                   f"live on the {'drive' if device == 'nvme' else 'host'}")
    if zero == 1:
        s.grads = r.params * n_params
        s.notes.append("ZeRO-1 reduces at the end of backward: the full 16-bit gradients are on the GPU until then")
    elif zero == 2:
        s.grads = 0
        s.notes.append("ZeRO-2 copies each reduced bucket's slice to the host: only the reduce buckets stay on the GPU")
    else:
        s.grads = 0
        host += r.params * sh
        s.notes.append("ZeRO-3 keeps its 16-bit gradient partition in host memory (DeepSpeed's self.device = cpu)")
    if offload == "optimizer+params":
        to_device += s.params
        s.params = 0
        s.notes.append("parameters are fetched to the GPU layer by layer (plus buffers)")
    if device == "cpu":
        s.host = host + to_device
    else:
        s.host, s.nvme = host, to_device
    return s


def optimizer_grad_bytes(r: "Recipe") -> int:
    """Bytes per element of the gradient an offloaded optimizer reads: its parameter copy's dtype
    (4 with an fp32 master or in fp32, 2 in pure-bf16)."""
    return 4 if any(label.startswith("master") for label, _ in r.optimizer) else r.params


DS_REDUCE_BUCKET = 500_000_000   # reduce_bucket_size, DeepSpeed 0.19.8's default (zero/config.py 113)
DS_PREFETCH_BUCKET = 50_000_000  # stage3_prefetch_bucket_size, its code default (zero/config.py)


class GatheredBytes(int):
    """ZeRO-3's working set in bytes (an ``int``), with its parts: ``params`` (parameters gathered
    whole at the fullest moment: the steady replay, or on demand the largest module), ``prefetch``
    (on demand only: the prefetch bucket beside it), ``grad`` (the largest module's full gradient,
    before its reduce-scatter, backward only), ``reduce`` (DeepSpeed's contiguous gradient bucket,
    allocated once and held all step); ``steady`` says which way ``params`` was counted.
    ``parts`` names them for display."""
    params: int
    grad: int
    reduce: int
    steady: bool
    prefetch: int

    def __new__(cls, params: int, grad: int, reduce: int, steady: bool = True, prefetch: int = 0):
        obj = super().__new__(cls, params + prefetch + grad + reduce)
        obj.params, obj.grad, obj.reduce, obj.steady, obj.prefetch = params, grad, reduce, steady, prefetch
        return obj

    def __reduce__(self):   # picklable, e.g. when a rank function returns one
        return (GatheredBytes, (self.params, self.grad, self.reduce, self.steady, self.prefetch))

    @property
    def gathered(self) -> int:
        """Parameter bytes gathered at the fullest moment (with the prefetch bucket on demand)."""
        return self.params + self.prefetch

    @property
    def parts(self) -> dict[str, int]:
        if self.steady:
            out = {"parameters gathered (steady step: prefetch and reuse replayed)": self.params}
        else:
            out = {"largest module's parameters, gathered": self.params, "prefetch bucket": self.prefetch}
        return out | {"largest module's full gradient, before reduce-scatter": self.grad,
                      "contiguous gradient (reduce) bucket": self.reduce}


def zero3_gathered(cfg_or_largest_params, recipe: str, prefetch_bucket: int = DS_PREFETCH_BUCKET,
                   reduce_bucket: int = DS_REDUCE_BUCKET, tp: int = 1, layers: int | None = None) -> GatheredBytes:
    """ZeRO-3's working set: the bytes a rank holds beyond its shards while it computes. The one
    definition every chapter, ``estimate`` and the planner use (``Timeline.zero3_per_gpu`` places
    the same parts on the step's timeline instead of adding them as constants).

    * gathered parameters: for a model, the fullest moment of a steady step replayed with
      DeepSpeed's rules (``zero3_schedule.gathered_by_moment``: the module running, the prefetch
      bucket ahead, modules kept whole for reuse); ``tp`` and ``layers`` replay one rank's tensor-
      parallel slice of one stage (registry or config file alike: ``zero3_schedule.replays``).
      Given only the largest module's element count, or another layout, the on-demand moment:
      that module + ``prefetch_bucket`` (a floor: prefetch and reuse can hold more);
    * the largest module's full gradient (for Llama the 128,256 x h embedding or output head),
      which exists in backward before it is reduce-scattered;
    * DeepSpeed's contiguous gradient bucket: ``reduce_bucket_size`` elements allocated at start and
      kept (``stage3.py`` 780-784, ``contiguous_gradients`` on by default), capped at the model's size.
    All in the parameters' dtype (bf16, or fp32 for the fp32 recipe).
    """
    for value, what in ((prefetch_bucket, "prefetch bucket"), (reduce_bucket, "reduce bucket")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UsageError(f"{what} must be a whole number of elements >= 0, got {value!r}")
    e = RECIPE[one_of(recipe, RECIPES, "recipe")].params
    cfg = cfg_or_largest_params if hasattr(cfg_or_largest_params, "largest_layer_params") else None
    if cfg is not None and zero3_schedule.replays(cfg):
        if layers is not None and layers != cfg.n_layers:
            cfg = with_layers(cfg, positive_int(layers, "layers"))
        largest = -(-cfg.largest_layer_params() // positive_int(tp, "tensor-parallel size"))
        gathered = _steady_gathered(cfg, e, tp, prefetch_bucket)
        total = sum(n for own in zero3_schedule.llama_params(cfg, tp).values() for _, n in own)
        return GatheredBytes(gathered, e * largest, e * min(reduce_bucket, total), True)
    largest = (positive_int(cfg_or_largest_params, "largest module's parameter count") if cfg is None
               else -(-cfg.largest_layer_params() // positive_int(tp, "tensor-parallel size")))
    return GatheredBytes(e * largest, e * largest, e * reduce_bucket, False, e * prefetch_bucket)


@lru_cache(maxsize=256)
def _steady_gathered(cfg, elem_bytes: int, tp: int, prefetch_bucket: int) -> int:
    return max(zero3_schedule.gathered_by_moment(cfg, {"stage3_prefetch_bucket_size": prefetch_bucket},
                                                 elem_bytes, tp).values())
