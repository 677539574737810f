"""Lab 08's graded cases, drawn afresh at each check (no list of answers can be kept).

* :func:`draw_model`: a dense Llama-like model's dimensions as a plain dict (the learner's input),
  shaped like published ones (head_dim 64 or 128, at least 4 heads, KV heads dividing the heads),
  with grouped-query attention and, in some draws, ``n_heads * head_dim != d_model`` (as Qwen3 and
  Gemma have), and :func:`config` the same model as the library's ``ModelConfig``;
* :func:`setups`: the fine-tuning setups part 1 grades on one model (full with torch AdamW and with
  8-bit AdamW, LoRA and QLoRA with drawn rank, targets, adapter dtype and optimizer);
* :data:`LADDER`: the recipes part 3 walks, the last one QLoRA with its base on the CPU
  (``LabFinetune(offload=True)``: chapter 08's ``scale.base_offloaded``, FSDP's CPU offload);
  :func:`totals`: each rung's GPU states, activation peaks and host bytes (:mod:`.lab_acts`).
  Part 3's cases are :mod:`.lab_cases`'.

Part 1's QLoRA setups are ones the library does not count (:class:`LabFinetune`): an NF4 block
other than 64 and, in one of the two, no double quantisation, so a copy of gpumem's counts, however
rewritten, is wrong on them. Their truth is :func:`truth`: the library's bytes for every role the
block does not touch, and a hand count of bitsandbytes 0.50.2 for the two it does
(:func:`nf4_constants`; tests compare it with ``bitsandbytes.functional.quantize_4bit`` run on the
CPU). Activation peaks are the library's (``finetune_activation_bytes``). All are computed here,
before the learner's call and outside its guard.
"""

from dataclasses import dataclass
from types import MappingProxyType

from gpumem.memory import models
from gpumem.memory.finetune import FT_TARGETS, Finetune, finetune_activation_bytes, finetune_states, matrices

from .scale import base_offloaded



@dataclass(frozen=True)
class LabFinetune(Finetune):
    """A :class:`Finetune` with two of bitsandbytes' NF4 choices that gpumem does not count:
    ``nf4_block``, the weights per absmax (``quantize_4bit(blocksize=...)``, ``Params4bit(blocksize=
    ...)``: 32 to 4,096, default 64), and ``double_quant`` (``compress_statistics``, transformers'
    ``bnb_4bit_use_double_quant``): absmaxes stored in 8 bits (True) or kept fp32 (False)."""
    nf4_block: int = 64
    double_quant: bool = True
    offload: bool = False     # every parameter on the CPU (FSDP CPU offload), blocks copied up when they run


NF4_BLOCKS = (32, 128, 256, 512)     # bitsandbytes quantize_4bit's accepted sizes, 64 (the library's) left out
NESTED_BLOCK, NF4_CODE, NESTED_MAP = 256, 16 * 4, 256 * 4   # quantize_4bit: blocksize=256; 16 and 256 fp32 values


def nf4_constants(n: int, block: int, double_quant: bool) -> int:
    """Bytes bitsandbytes 0.50.2 keeps beside one n-element NF4 weight's codes (hand count of
    ``functional.quantize_4bit``): double quantisation: uint8 absmaxes, an fp32 absmax per 256 of
    them, an fp32 offset, the NF4 code and the nested map; without: fp32 absmaxes and the code."""
    blocks = -(-n // block)
    if not double_quant:
        return 4 * blocks + NF4_CODE
    return blocks + 4 * -(-blocks // NESTED_BLOCK) + 4 + NF4_CODE + NESTED_MAP


def truth(cfg, ft: LabFinetune) -> dict[str, int]:
    """The bytes by role of a lab setup: gpumem's for the roles the NF4 block does not touch,
    :func:`nf4_constants` and the dequantised matrix (bf16, with its fp32 absmaxes rebuilt when
    they are stored 8-bit) for the two it does."""
    roles = finetune_states(cfg, ft)
    if ft.base_dtype == "nf4":
        sizes = [i * o for i, o in matrices(cfg).values()] * cfg.n_layers
        big = max(sizes)
        roles["quant_constants"] = sum(nf4_constants(m, ft.nf4_block, ft.double_quant) for m in sizes)
        roles["dequant_buffer"] = 2 * big + (4 * -(-big // ft.nf4_block) if ft.double_quant else 0)
    return roles


def prepare_cast(model: dict) -> int:
    """Bytes peft's ``prepare_model_for_kbit_training`` adds to a QLoRA base, which the lab's rungs
    leave out (review r15 #3, for the rows' hints): every parameter that is not 4-bit (embedding,
    head unless tied, two norms a layer and the final norm) cast from bf16 to fp32, 2 B more each."""
    h, L = model["d_model"], model["n_layers"]
    return 2 * (model["vocab"] * h * (1 if model["tie_embeddings"] else 2) + (2 * L + 1) * h)


# The ladder, most faithful first: full weights before adapters, 32-bit moments before 8-bit,
# a bf16 base before a 4-bit one. "The most faithful recipe that fits" = the first rung that fits. Read-only: the
# learner's notebook imports this very mapping, and the grader's answers are drawn from it.
LADDER = MappingProxyType({
    "full": LabFinetune(),
    "full-8bit": LabFinetune(optimizer="adamw-8bit"),
    "lora": LabFinetune(adapter="lora"),
    "qlora": LabFinetune(adapter="lora", base_dtype="nf4"),
    "qlora-cpu": LabFinetune(adapter="lora", base_dtype="nf4", offload=True),
})
NF4_CHOICES = tuple((b, d) for b in (32, 64, 128, 256, 512) for d in (True, False) if (b, d) != (64, True))
HEAVY = ((32, False), (64, False))   # fp32 absmaxes per 32 or 64 weights: 0.125 or 0.0625 B a weight


def ladder(block: int = 64, double_quant: bool = True) -> MappingProxyType:
    """:data:`LADDER` with its two QLoRA rungs' NF4 block and double quantisation set (read-only)."""
    q = dict(adapter="lora", base_dtype="nf4", nf4_block=block, double_quant=double_quant)
    return MappingProxyType({**LADDER, "qlora": LabFinetune(**q), "qlora-cpu": LabFinetune(**q, offload=True)})


CARDS = ("t4", "l4", "a100-40gb", "a100-80gb", "h100-80gb", "h200")   # gpumem.memory.gpus (sourced there)
SEQS = (512, 1024, 2048, 4096)
SHOWN_WIDTHS = {2048, 4096, 8192}     # the d_model of the examples the lab's notebook shows


HEAD_COUNTS = (4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64)


def draw_model(rng, wide: bool = False, odd_heads: bool | None = None) -> dict:
    """A dense model's dimensions (the learner's view), shaped like published ones (review r10 #12):
    head_dim 64 or 128, 4 to 64 heads, KV heads dividing them (GQA, or all of them);
    ``odd_heads``: n_heads * head_dim != d_model (Qwen3, Gemma); ``wide``: d_model 2,560 - 8,064."""
    while True:
        d_model = 128 * (rng.randrange(20, 64) if wide else rng.randrange(4, 21))
        head_dim = rng.choice((64, 128))
        if odd_heads is None:
            odd = rng.random() < 0.5
        else:
            odd = odd_heads
        if odd:
            n_heads = rng.choice([a for a in HEAD_COUNTS if d_model <= 2 * a * head_dim <= 4 * d_model
                                  and a * head_dim != d_model] or [0])
        else:                # n_heads * head_dim == d_model, the heads a published count (review r12 7.4)
            n_heads = d_model // head_dim if d_model % head_dim == 0 and d_model // head_dim in HEAD_COUNTS else 0
        if n_heads >= 4 and d_model not in SHOWN_WIDTHS:
            break
    n_kv = rng.choice([k for k in (2, 4, 8, n_heads) if n_heads % k == 0 and k <= n_heads])
    return {"n_layers": rng.randrange(2, 9), "d_model": d_model, "n_heads": n_heads, "n_kv_heads": n_kv,
            "head_dim": head_dim, "ffn": 256 * round(d_model * rng.uniform(2.4, 3.6) / 256),
            "vocab": rng.randrange(1000, 160_000), "tie_embeddings": rng.random() < 0.3}


def config(model: dict) -> models.ModelConfig:
    """The library's view of a drawn model."""
    return models.ModelConfig(name="drawn", n_layers=model["n_layers"], d_model=model["d_model"],
                              n_heads=model["n_heads"], n_kv_heads=model["n_kv_heads"], ffn=model["ffn"],
                              vocab=model["vocab"], explicit_head_dim=model["head_dim"],
                              tie_embeddings=model["tie_embeddings"])


def _targets(rng) -> tuple[str, ...]:
    picked = [t for t in FT_TARGETS if rng.random() < 0.5] or [rng.choice(FT_TARGETS)]
    return tuple(picked)


def setups(rng) -> list[LabFinetune]:
    """Six setups for one model: full (AdamW, 8-bit AdamW), LoRA twice (fp32 adapters with either
    optimizer, bf16 adapters with torch AdamW), QLoRA twice, each QLoRA
    with an NF4 block other than 64, one of them without double quantisation (drawn which)."""
    r = lambda: rng.choice((2, 4, 8, 16, 32, 64))   # noqa: E731
    dq = rng.sample((True, False), 2)
    return [LabFinetune(), LabFinetune(optimizer="adamw-8bit"),
            LabFinetune(adapter="lora", lora_rank=r(), lora_targets=_targets(rng),
                        optimizer=rng.choice(("adamw", "adamw-8bit"))),
            # bf16 adapters with torch AdamW: moments in bf16 (a count that keeps them fp32 fails here)
            LabFinetune(adapter="lora", lora_rank=r(), lora_targets=_targets(rng), adapter_dtype="bf16"),
            LabFinetune(adapter="lora", base_dtype="nf4", lora_rank=r(), lora_targets=FT_TARGETS,
                        nf4_block=rng.choice(NF4_BLOCKS), double_quant=dq[0]),
            LabFinetune(adapter="lora", base_dtype="nf4", lora_rank=r(), lora_targets=_targets(rng),
                        optimizer=rng.choice(("adamw", "adamw-8bit")), nf4_block=rng.choice(NF4_BLOCKS),
                        double_quant=dq[1])]


def states_cases(rng) -> list[tuple[dict, list[tuple[Finetune, dict]]]]:
    """Three models (one with n_heads * head_dim == d_model, two without; the second always ties
    its head to the embedding), each with its setups and their bytes by role (:func:`truth`)."""
    out = []
    for i, odd in enumerate((True, False, True)):
        model = draw_model(rng, odd_heads=odd)
        if i == 1:
            model["tie_embeddings"] = True
        cfg = config(model)
        out.append((model, [(ft, truth(cfg, ft)) for ft in setups(rng)]))
    return out


# Within a rung: no re-run first (faster), then every layer checkpointed (one more forward per
# step). A setup is (rung, policy); the answer is the first in this order that fits.
POLICIES = ("none", "full")
SETUPS = tuple((rung, policy) for rung in LADDER for policy in POLICIES)


def _pieces(model: dict, seq: int, batch: int, rungs) -> dict[tuple, int]:
    """(rung, part) -> bytes: ``states`` (on the GPU besides activations), ``host``, and for each
    policy its forward and recompute peaks (the activation peak is their larger)."""
    cfg, out, seen = config(model), {}, {}
    for name, ft in rungs.items():
        key = (ft.adapter, ft.base_dtype, ft.lora_rank, ft.lora_targets, ft.adapter_dtype)
        if key not in seen:          # full and full-8bit save alike, and so do QLoRA on the GPU or not
            seen[key] = {p: finetune_activation_bytes(cfg, ft, seq, batch, checkpoint=p) for p in POLICIES}
        for p, a in seen[key].items():
            out[name, p, "forward"], out[name, p, "recompute"] = a["forward_peak"], a["recompute_peak"]
        if getattr(ft, "offload", False):
            o = offloaded(cfg, ft, seq, batch, "full")
            out[name, "states"], out[name, "host"] = o["gpu"] - o["activations"], o["host"]
        else:
            out[name, "states"], out[name, "host"] = sum(truth(cfg, ft).values()), 0
    return out


def _assemble(pieces: dict, rungs) -> dict[str, tuple[int, dict[str, int], int]]:
    return {name: (pieces[name, "states"], {p: max(pieces[name, p, "forward"], pieces[name, p, "recompute"])
                                            for p in POLICIES}, pieces[name, "host"]) for name in rungs}


def totals(model: dict, seq: int, batch: int, rungs=LADDER) -> dict[str, tuple[int, dict[str, int], int]]:
    """rung -> (GPU bytes besides activations, {policy: activation peak}, host bytes), one GPU: a
    rung on the GPU holds its states (:func:`truth`) and needs no host memory; the ``offload`` rung
    is :func:`offloaded`'s (FSDP CPU offload of every parameter)."""
    return _assemble(_pieces(model, seq, batch, rungs), rungs)


def in_depth(model: dict, seq: int, batch: int, rungs=LADDER, key: str = "n_layers", at: tuple = (2, 3)):
    """``x -> totals(model with model[key] = x)`` extrapolated from two values of ``key``: with the
    other dimensions fixed every piece is affine in the depth (each layer alike; a checkpointed
    step's peaks are the forward's end and the last layer's re-run) and nearly so in the
    vocabulary (per-block roundings aside). For searching only: a drawn case is checked with
    :func:`totals` itself."""
    a, b = (_pieces(dict(model, **{key: x}), seq, batch, rungs) for x in at)
    seen: dict[int, dict] = {}       # a search asks for the same x again and again

    def figures(x: int) -> dict:
        if x not in seen:
            seen[x] = _assemble({k: a[k] + (b[k] - a[k]) * (x - at[0]) // (at[1] - at[0]) for k in a}, rungs)
        return seen[x]
    return figures


def total(figures: dict, setup: tuple[str, str]) -> int:
    """GPU bytes of ``setup`` (rung, policy): states (or what offload keeps there) + activations."""
    states, acts, _ = figures[setup[0]]
    return states + acts[setup[1]]


def fits(figures: dict, setup: tuple[str, str], usable: int, host_ram: int) -> bool:
    """``setup``'s GPU bytes fit ``usable`` and its host bytes fit ``host_ram``."""
    return total(figures, setup) <= usable and figures[setup[0]][2] <= host_ram


def library_total(model: dict, figures: dict, rungs) -> int:
    """The QLoRA rung's total, checkpointed, as gpumem counts it (its NF4 choices ignored: block
    64, double quantised), with the case's activations: what a copy of the library would compare."""
    return sum(finetune_states(config(model), rungs["qlora"]).values()) + figures["qlora"][1]["full"]


def answer(figures: dict, usable: int, host_ram: int) -> tuple[str, str] | None:
    """The first setup (rung, policy) that fits (:func:`fits`), None if none does."""
    return next((setup for setup in SETUPS if fits(figures, setup, usable, host_ram)), None)


def offloaded(cfg, ft, seq: int, batch: int, policy: str) -> dict[str, int]:
    """``gpu``, ``host`` and ``pcie`` (bytes copied host to device a step) of ``ft`` with every
    parameter on the CPU, and its ``activations`` and the parts the rows name (``root``, ``block``:
    one block's weights as FSDP copies them up, ``block_grads``: its adapters' gradients)."""
    o = base_offloaded(cfg, ft, policy, seq, batch)
    lib, lab = finetune_states(cfg, ft), truth(cfg, ft)
    fix = sum(lab[r] - lib[r] for r in ("quant_constants", "dequant_buffer"))
    block = o["streamed"] // cfg.n_layers
    return {"gpu": o["gpu"] + fix, "host": o["host"], "pcie": o["copied"],
            "activations": o["activations"], "root": o["root"], "block": block,
            "block_grads": lab["grads"] // cfg.n_layers, "constants": lab["quant_constants"],
            "dequant_buffer": lab["dequant_buffer"]}
