"""One training step's memory per GPU: model states (``accounting``) + activations (``activations``).

This is what ``python -m gpumem estimate`` prints. Activations are per GPU and do not shrink
with ZeRO (each rank runs its own micro-batch). At ZeRO stage 3 a rank also holds a working set
beyond its shards, ``gathered`` (``accounting.zero3_gathered``, for a registry model and a config
file alike: the gathered parameters of DeepSpeed's replayed steady step, the largest module's full
gradient, the reduce bucket). Temporaries (gradients of activations in backward, optimizer
workspace) are not included: ``python -m gpumem trace`` measures them.
The total adds every part, as if all peaked at once: on the safe side of the traced peak.
"""

from dataclasses import dataclass, field

from ..errors import UsageError, positive_int
from . import accounting, models
from .activations import Activations, activations

# Architectures the activation formula counts: a Llama layer (``gpumem.memory.llama``), where a
# q/k/v bias adds no saved tensor (addmm keeps its input and weight, not the bias), q/k norms
# (Qwen3) add their own terms, and a sliding window (Mistral) adds terms in transformers' code
# (``impl="hf"``); GPT-2's LayerNorm, gelu_new MLP and learned positions have theirs; Gemma 2's
# norms and soft-capping and a mixture of experts' router and experts (``moe_acts``) theirs.
# tests/test_hf_trace.py and tests/test_hf_moe.py check each against a trace of transformers' model.
LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "gpt2", "gemma2", "mixtral", "qwen3_moe")


def n_param_tensors(cfg: models.ModelConfig) -> int:
    """Parameter tensors as transformers 5 builds them (a Llama: 9 per layer, 7 linear + 2 norms,
    and the embedding, head and final norm): biases, q/k norms, LayerNorm's bias, and a mixture of
    experts' fused tensors (``gate_up_proj``, ``down_proj``) and router count one each."""
    per_norm = 2 if cfg.norm_kind == "layer" else 1
    mats = 2 if cfg.mlp == "gelu" else 3
    mlp = 3 if cfg.moe else mats * (1 + cfg.mlp_bias)
    qkv = 1 if cfg.fused_qkv else 3
    layer = (qkv + 1 + qkv * cfg.qkv_bias + cfg.o_bias + 2 * cfg.qk_norm + cfg.norms_per_layer * per_norm + mlp)
    outside = 1 + (not cfg.tie_embeddings) + (cfg.positions > 0) + per_norm
    return layer * cfg.n_layers + outside


@dataclass
class Estimate:
    """One training step's per-GPU bytes: model states, activations, and the options behind them."""
    model: str
    n_params: int
    recipe: str
    gpus: int
    zero: int
    states: accounting.States
    acts: Activations | None = None
    options: dict = field(default_factory=dict)
    gathered: accounting.GatheredBytes | int = 0
    roles: dict | None = None        # finetune.finetune_states: role -> bytes per GPU
    buffers: int = 0                 # QLoRA's dequantised weight (finetune's dequant_buffer)
    finetune: dict | None = None     # the fine-tuning setup, where one was given

    @property
    def activation_bytes(self) -> int:
        return self.acts.peak if self.acts else 0

    @property
    def total(self) -> int:
        return self.states.total + self.activation_bytes + int(self.gathered) + self.buffers

    def as_dict(self) -> dict:
        s = self.states
        out = {"model": self.model, "n_params": self.n_params, "recipe": self.recipe,
               "gpus": self.gpus, "zero": self.zero, **self.options,
               "per_gpu": {"params": s.params, "grads": s.grads, "optimizer": s.optimizer,
                           "activations": self.activation_bytes, "gathered": int(self.gathered),
                           "total": self.total},
               "activations_counted": self.acts is not None}
        if self.finetune is not None:
            out["per_gpu"] = {k: v for k, v in out["per_gpu"].items() if k != "total"} | {
                "buffers": self.buffers, "total": self.total}
            out["finetune"] = self.finetune
        if self.roles is not None:
            out["roles"] = self.roles
        if isinstance(self.gathered, accounting.GatheredBytes):
            out["gathered_parts"] = self.gathered.parts
        if s.host:
            out["host"] = s.host
        if s.nvme:
            out["nvme"] = s.nvme
        if s.notes:
            out["notes"] = s.notes
        return out


def estimate(model: str | None = None, params: int | None = None, gpus: int = 1, zero: int = 0,
             recipe: str = "mixed", seq: int = 4096, micro_batch: int = 1, checkpoint: str = "none",
             attention: str = "flash", offload: str = "none", offload_device: str = "cpu",
             norm: str = "fused", largest_layer: int | None = None,
             prefetch_bucket: int = 50_000_000, finetune=None) -> Estimate:
    """Per-GPU bytes of a training step for a registry model, or model states only for a
    parameter count (with ``largest_layer``, the ZeRO-3 working set too). A ``largest_layer``
    above ``params`` is refused (:class:`UsageError`); below ZeRO-3 it is not used, and a note
    says so (only ZeRO-3 gathers parameters on the fly). ``finetune`` (a ``finetune.Finetune``)
    other than full fine-tuning with torch AdamW counts by ``finetune`` (:func:`_finetuned`)."""
    if finetune is not None and not finetune.plain:
        return _finetuned(model, params, gpus, zero, recipe, seq, micro_batch, checkpoint, attention,
                          offload, norm, prefetch_bucket, finetune)
    if (model is None) == (params is None):
        raise UsageError("give exactly one of --model NAME (or --config PATH) or --params N")
    if model is not None:
        if largest_layer is not None:
            raise UsageError("--largest-layer goes with --params; a --model knows its largest layer")
        cfg = model if isinstance(model, models.ModelConfig) else models.get(model)
        states = accounting.model_states(cfg.n_params(), recipe, gpus, zero, offload, offload_device,
                                         n_tensors=n_param_tensors(cfg))
        opts = {"seq": seq, "micro_batch": micro_batch, "checkpoint": checkpoint, "attention": attention,
                "norm": norm, "offload": offload, "offload_device": offload_device}
        roles = None
        if offload == "none":   # the same bytes by role (finetune's split of accounting's)
            from .finetune import Finetune, finetune_states
            roles = finetune_states(cfg, Finetune(recipe=recipe), gpus=gpus, zero=zero)
        if cfg.model_type == "llama" and cfg.name in models.REGISTRY:
            acts = activations(cfg, seq, micro_batch, attention, checkpoint, recipe, norm)
            gathered = accounting.zero3_gathered(cfg, recipe, prefetch_bucket) if zero == 3 else 0
            return Estimate(cfg.name, cfg.n_params(), recipe, gpus, zero, states, acts, opts, gathered, roles)
        est = _from_config(cfg, states, recipe, gpus, zero, opts, prefetch_bucket)
        est.roles = roles
        return est
    states = accounting.model_states(params, recipe, gpus, zero, offload, offload_device)
    gathered = 0
    if largest_layer is not None:
        largest_layer = positive_int(largest_layer, "--largest-layer")
        if largest_layer > int(params):
            raise UsageError(f"--largest-layer {largest_layer:,} is larger than the model's {int(params):,} "
                             f"parameters; accepted: a module's parameter count up to --params")
        if zero != 3:
            states.notes.append(f"--largest-layer not used at ZeRO-{zero}: only ZeRO-3 gathers a module's "
                                "parameters on the fly (its working set)")
    if zero == 3 and largest_layer is not None:
        gathered = accounting.zero3_gathered(largest_layer, recipe, prefetch_bucket)
    elif zero == 3:
        states.notes.append("ZeRO-3 working set not counted: give --largest-layer N (the largest "
                            "module's parameter count)")
    return Estimate("params", int(params), recipe, gpus, zero, states, None,
                    {"offload": offload, "offload_device": offload_device}, gathered)


def _from_config(cfg: models.ModelConfig, states: accounting.States, recipe: str, gpus: int, zero: int,
                 opts: dict, prefetch_bucket: int) -> Estimate:
    """A model from a config file: exact model states; activations where the formula covers the
    layer (the course's code at these widths; with ``norm="hf"``, transformers' own code,
    ``impl="hf"``); ZeRO-3's working set as for a registry model (``accounting.zero3_gathered``)."""
    acts = None
    if cfg.model_type in LLAMA_LIKE:
        acts = activations(cfg, opts["seq"], opts["micro_batch"], opts["attention"], opts["checkpoint"],
                           recipe, opts["norm"], impl="hf" if opts["norm"] == "hf" else "course")
    else:
        states.notes.append(f"activations not counted for model_type {cfg.model_type}: its layer is not "
                            f"Llama's; model states are exact")
    if cfg.model_type == "gemma2" and opts["attention"] != "eager":
        states.notes.append("Gemma 2 soft-caps its attention scores: transformers runs it with eager attention "
                            "(traced: tests/test_hf_moe.py); flash here is a kernel that soft-caps, untraced")
    if cfg.moe:
        states.notes.append(f"mixture of experts: {cfg.n_params(active=True) / 1e9:.2f} B of the "
                            f"{cfg.n_params() / 1e9:.2f} B parameters are used per token ({cfg.top_k} of "
                            f"{cfg.n_experts} experts); every expert has weights, gradients and optimizer states")
    gathered = accounting.zero3_gathered(cfg, recipe, prefetch_bucket) if zero == 3 else 0
    if zero == 3 and not gathered.steady:
        states.notes.append(f"ZeRO-3 working set: the on-demand moment (largest module + prefetch bucket), a "
                            f"floor: the replay of DeepSpeed's prefetch and reuse builds Llama-layout models, "
                            f"not {cfg.model_type}'s modules (zero3_schedule.replays)")
    return Estimate(cfg.name, cfg.n_params(), recipe, gpus, zero, states, acts, opts, gathered)


def _finetuned(model, params, gpus, zero, recipe, seq, micro_batch, checkpoint, attention, offload, norm,
               prefetch_bucket, ft) -> Estimate:
    """LoRA, QLoRA or 8-bit AdamW (``finetune``): the model states by role, grouped into the
    categories; activations: for LoRA ``finetune_acts``, for full fine-tuning as without it."""
    from dataclasses import asdict, replace

    from . import finetune
    if model is None:
        raise UsageError("--adapter, --base-dtype and --optimizer adamw-8bit need --model or --config: "
                         "adapters and 8-bit blocks are counted per matrix")
    ft = replace(ft, recipe=recipe)
    finetune.validate(ft, zero)
    if offload != "none":
        raise UsageError(f"--offload {offload} is not counted with --adapter lora or --optimizer adamw-8bit "
                         "(DeepSpeed's offload runs its own CPU Adam); accepted: --offload none")
    cfg = model if isinstance(model, models.ModelConfig) else models.get(model)
    roles = finetune.finetune_states(cfg, ft, gpus=gpus, zero=zero)
    g = finetune.grouped(roles)
    est = estimate(model=cfg, gpus=gpus, zero=zero, recipe=recipe, seq=seq, micro_batch=micro_batch,
                   checkpoint=checkpoint, attention=attention, norm=norm, prefetch_bucket=prefetch_bucket)
    est.states = accounting.States(params=g["params"], grads=g["grads"], optimizer=g["optimizer"],
                                   notes=est.states.notes)
    est.roles, est.buffers = roles, g["buffers"]
    est.finetune = asdict(ft) | {"lora_targets": list(ft.lora_targets)}
    if ft.lora:
        impl = "course" if cfg.name in models.REGISTRY or norm == "fused" else "hf"     # as estimate() counts
        d = finetune.finetune_activation_bytes(cfg, ft, seq, micro_batch, attention=attention,
                                               checkpoint=checkpoint, norm=norm, impl=impl)
        est.acts = Activations(per_layer=d["per_layer"], checkpoint_input=d["checkpoint_input"],
                               layers=d["layers"], outside=d["outside"], loss=d["loss"],
                               forward_peak=d["forward_peak"], recompute_peak=d["recompute_peak"],
                               parts={k[7:]: v for k, v in d.items() if k.startswith("layer: ")})
        if zero == 3:
            est.states.notes.append("ZeRO-3 working set counted as for full fine-tuning (bf16 weights, a "
                                    "full gradient): an upper bound with a frozen base")
    if ft.base_dtype == "nf4":
        est.states.notes.append("not counted: peft's prepare_model_for_kbit_training upcasts the embedding, "
                                "head and norms to fp32 (+2 B each)" + (
                                    "; ZeRO-3 shards the packed 4-bit weights (bnb_4bit_quant_storage set to "
                                    "the model's dtype), not their NF4 constants" if zero == 3 else ""))
    return est
