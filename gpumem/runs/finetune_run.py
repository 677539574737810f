"""Fine-tuning run for real on the CPU: full (AdamW, 8-bit AdamW), LoRA and QLoRA (chapter 08).

A tiny Llama (transformers' ``LlamaForCausalLM`` from :data:`TINY`, seeded, real tensors) is
set up by ``gpumem.memory.finetune_build`` with the libraries people use (peft's LoRA,
bitsandbytes' NF4 ``Linear4bit`` and 8-bit AdamW, both on bitsandbytes' CPU backend) and trained
a few steps on one fixed batch. :func:`run` returns the loss of every step, the trainable
parameter count, and the bytes held by role, measured on the tensors themselves (each storage
counted once):

* ``weights``: the model's parameters that are not adapters: bf16 weights, and for an NF4 base
  the packed 4-bit data, the uint8 block scales (one per 64 weights) and the fp32 second-level
  scales (one per 256 blocks);
* ``adapters``: LoRA's A and B matrices (fp32: peft's default);
* ``grads``: the gradients after backward (before the optimizer step);
* ``optimizer``: the tensors in ``optimizer.state`` after the first step (fp32 master and
  moments; or uint8 moments and their fp32 block scales, one per 256 values);
* ``buffers``: the model's buffers (the rotary inverse frequencies);
* ``quant_constants``: per quantised weight, tables whose size does not grow with it: NF4's
  16-value fp32 code, the fp32 offset, and the 256-value fp32 code of the second-level
  quantisation (bitsandbytes 0.50.2 keeps one per tensor: 14 distinct storages in the tiny QLoRA);
* ``optimizer_constants``: step counters (torch AdamW: a 4-byte tensor per parameter tensor;
  bitsandbytes: a Python int) and 8-bit AdamW's two shared 256-value fp32 quantisation maps.

bitsandbytes keeps the moments of a tensor with fewer than 4,096 elements in fp32 (its
``min_8bit_size``): the norms' weights always, and at the tiny size LoRA's smaller matrices.
"""

import contextlib
import warnings

import torch

from ..memory.finetune import Finetune
from ..memory.finetune_build import build_ft, make_ft_optimizer

# A small Llama: 2 layers, d 128, 4 heads of 32 (2 key/value heads), FFN 256, vocabulary 256. Its
# matrices hold 8,192 to 32,768 weights: 128 to 512 NF4 blocks of 64, so one or two second-level
# scale blocks of 256 (k and v: one partly filled). Rank 32 puts LoRA's A (32 x 128 = 4,096) at
# bitsandbytes' 8-bit threshold and k's and v's B (64 x 32) below it.
TINY = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "hidden_act": "silu",
        "max_position_embeddings": 64, "tie_word_embeddings": False, "attention_dropout": 0.0}
RANK = 32
SETUPS = {
    "full": Finetune(),
    "full-8bit": Finetune(optimizer="adamw-8bit", recipe="pure-bf16"),   # bitsandbytes keeps no fp32 master
    "lora": Finetune(adapter="lora", lora_rank=RANK),
    "qlora": Finetune(adapter="lora", lora_rank=RANK, base_dtype="nf4", optimizer="paged-adamw"),
    "qlora-8bit": Finetune(adapter="lora", lora_rank=RANK, base_dtype="nf4", optimizer="adamw-8bit"),
}
CONSTANT_STATE_KEYS = ("step", "qmap1", "qmap2", "unorm_vec")


class _Bytes:
    """Bytes per role, each storage counted once (a tensor shared by two roles: the first)."""

    def __init__(self):
        self.roles: dict[str, int] = {}
        self._seen: set[int] = set()

    def add(self, role: str, t) -> None:
        """Count ``t``'s storage under ``role`` unless counted already."""
        if not torch.is_tensor(t):
            return
        storage = t.untyped_storage()
        key = storage.data_ptr() if storage.nbytes() else id(t)
        self.roles.setdefault(role, 0)
        if key not in self._seen:
            self._seen.add(key)
            self.roles[role] += storage.nbytes()


def _quant_tensors(p):
    """An NF4 parameter's scale tensors (per-block) and constant tables."""
    qs = getattr(p, "quant_state", None)
    if qs is None:
        return [], []
    scales, consts = [qs.absmax], [qs.code, qs.offset]
    if qs.nested:
        scales.append(qs.state2.absmax)
        consts.append(qs.state2.code)
    return scales, consts


def model_bytes(model, acc: _Bytes | None = None) -> _Bytes:
    """``weights``, ``adapters``, ``buffers`` and the NF4 ``quant_constants`` of ``model``."""
    acc = acc or _Bytes()
    for name, p in model.named_parameters():
        role = "adapters" if ".lora_" in name else "weights"
        acc.add(role, p)
        scales, consts = _quant_tensors(p)
        for t in scales:
            acc.add(role, t)
        for t in consts:
            acc.add("quant_constants", t)
    for b in model.buffers():
        acc.add("buffers", b)
    return acc


def grad_bytes(model, acc: _Bytes) -> None:
    """Add the gradients alive now as ``grads``."""
    for p in model.parameters():
        if p.grad is not None:
            acc.add("grads", p.grad)


def optimizer_bytes(opt, acc: _Bytes) -> None:
    """Add every tensor in ``opt.state``: ``optimizer``, or ``optimizer_constants`` (steps, maps)."""
    for state in opt.state.values():
        for key, t in state.items():
            acc.add("optimizer_constants" if key in CONSTANT_STATE_KEYS else "optimizer", t)


def trainable(model) -> int:
    """Trainable parameter elements."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def batch(raw: dict, seq: int, rows: int, seed: int = 0) -> torch.Tensor:
    """The fixed training batch: (rows, seq) token ids."""
    gen = torch.Generator().manual_seed(seed + 1)
    return torch.randint(0, raw["vocab_size"], (rows, seq), generator=gen)


def run(setup: str | Finetune = "full", steps: int = 4, lr: float = 1e-3, seq: int = 32, rows: int = 2,
        raw: dict = TINY, seed: int = 0) -> dict:
    """Train ``setup`` for ``steps`` on one fixed batch; losses, trainable count, bytes by role."""
    ft = SETUPS[setup] if isinstance(setup, str) else setup
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # bitsandbytes: "paged optimizers are not supported on CPU"
        model, _ = build_ft(raw, ft, seed=seed)
        opt = make_ft_optimizer(model, ft, lr)
        tokens = batch(raw, seq, rows, seed)
        losses, acc = [], model_bytes(model)
        for step in range(steps):
            amp = torch.autocast("cpu", dtype=torch.bfloat16) if ft.autocast else contextlib.nullcontext()
            with amp:
                loss = model(input_ids=tokens, labels=tokens, use_cache=False).loss
            loss.backward()
            if step == 0:
                grad_bytes(model, acc)
            opt.step()
            if step == 0:
                optimizer_bytes(opt, acc)
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
    roles = {k: acc.roles.get(k, 0) for k in ("weights", "adapters", "quant_constants", "grads", "optimizer",
                                                "optimizer_constants", "buffers")}
    return {"setup": setup if isinstance(setup, str) else "custom", "losses": losses,
            "trainable": trainable(model), "bytes": roles, "optimizer_class": type(opt).__name__}


def run_all(steps: int = 4, lr: float = 1e-3, **kwargs) -> dict:
    """Every setup in :data:`SETUPS` on the same model and batch."""
    return {name: run(name, steps, lr, **kwargs) for name in SETUPS}
