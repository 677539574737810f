"""Fine-tuning models and optimizers built with the libraries people use (chapter 08, issue 23).

``build_ft(raw, ft)`` builds transformers' own model from a config dictionary in bf16 and turns it
into the setup a :class:`~gpumem.memory.finetune.Finetune` describes:

* ``base_dtype="nf4"``: every ``nn.Linear`` but ``lm_head`` becomes bitsandbytes'
  ``Linear4bit`` (NF4, blocks of 64, double quantisation of the block scales, compute dtype
  bf16): what ``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
  bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=bfloat16)`` gives in
  ``from_pretrained`` (transformers keeps ``lm_head`` and the embeddings in bf16). Real tensors
  only: bitsandbytes' ``Params4bit`` cannot wrap a fake tensor.
* ``adapter="lora"``: peft's ``get_peft_model`` with ``LoraConfig(r, lora_alpha=2r,
  lora_dropout, target_modules)``; every other parameter frozen. Adapters in fp32 (peft's
  ``autocast_adapter_dtype=True`` default) or bf16.

On fake tensors (``FakeTensorMode``) peft works with two stated changes that leave the bytes as
on real tensors: the adapters are created in bf16 and upcast by hand (as peft's autocast does),
and peft's ``module.to(<the device it is on>)`` is skipped, because torch's ``Module._apply``
swaps fake parameters, which fails (a weak reference is held on them).

``make_ft_optimizer`` picks the optimizer: mixed recipes' fp32-master AdamW
(``optim.MasterWeightAdamW``) or torch AdamW (fp32 adapters) for ``adamw``; bitsandbytes'
``AdamW8bit`` for ``adamw-8bit`` (``PagedAdamW8bit`` for QLoRA); ``PagedAdamW32bit`` for
``paged-adamw`` (on a CPU bitsandbytes warns and allocates ordinary tensors: paging is CUDA
unified memory).
"""

import contextlib

import torch

from .optim import MasterWeightAdamW
from .tracer import param_dtype

HF_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj",
            "gate": "gate_proj", "up": "up_proj", "down": "down_proj"}


@contextlib.contextmanager
def _no_op_moves():
    """``Module.to`` returns the module unchanged when nothing would change (fake tensors only)."""
    orig = torch.nn.Module.to

    def to(self, *args, **kwargs):
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        same = all((device is None or t.device.type == torch.device(device).type)
                   and (dtype is None or not t.is_floating_point() or t.dtype == dtype)
                   for t in [*self.parameters(), *self.buffers()])
        return self if same else orig(self, *args, **kwargs)
    torch.nn.Module.to = to
    try:
        yield
    finally:
        torch.nn.Module.to = orig


def to_nf4(model: torch.nn.Module) -> torch.nn.Module:
    """Every ``nn.Linear`` but ``lm_head`` replaced by bitsandbytes' NF4 ``Linear4bit`` (in place)."""
    import bitsandbytes as bnb
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)   # bitsandbytes' code tables in fp32, as from_pretrained makes them
    try:
        _replace_linears(model, bnb)
    finally:
        torch.set_default_dtype(old)
    return model


def _replace_linears(model, bnb) -> None:
    for mod in list(model.modules()):
        for name, child in list(mod.named_children()):
            if type(child) is torch.nn.Linear and name != "lm_head":
                q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                      compute_dtype=torch.bfloat16, compress_statistics=True,
                                      quant_type="nf4", device="meta")
                q.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False, compress_statistics=True,
                                             quant_type="nf4", module=q)._quantize("cpu")
                if child.bias is not None:
                    q.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
                setattr(mod, name, q.train(child.training))


def lora_config(ft, dropout: float = 0.0):
    """peft's ``LoraConfig`` for ``ft``: rank r, alpha 2r, the targets' transformers names."""
    import peft
    return peft.LoraConfig(r=ft.lora_rank, lora_alpha=2 * ft.lora_rank, lora_dropout=dropout,
                           target_modules=[HF_NAMES[t] for t in ft.lora_targets], bias="none")


def build_ft(raw: dict, ft, fake: bool = False, seed: int = 0, attention: str = "sdpa",
             dropout: float = 0.0, prepare: bool = False):
    """transformers' model for ``raw`` set up as ``ft`` says (train mode), and the tensor mode.
    ``prepare``: peft's ``prepare_model_for_kbit_training(use_gradient_checkpointing=False)``
    first, as QLoRA recipes do: every parameter that is not 4-bit (embedding, norms, head) in fp32."""
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode
    if fake and ft.base_dtype == "nf4":
        raise ValueError("an NF4 base needs real tensors (bitsandbytes' Params4bit)")
    mode = FakeTensorMode() if fake else contextlib.nullcontext()
    hf_cfg = transformers.AutoConfig.for_model(**raw)
    old = torch.get_default_dtype()
    torch.manual_seed(seed)
    torch.set_default_dtype(param_dtype(ft.recipe) if ft.adapter == "none" else torch.bfloat16)
    try:
        with mode:
            model = transformers.AutoModelForCausalLM.from_config(hf_cfg, attn_implementation=attention).train()
            if ft.base_dtype == "nf4":
                to_nf4(model)
            if prepare:
                import peft
                model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
            if ft.adapter == "lora":
                model = _peft(model, ft, fake, dropout)
    finally:
        torch.set_default_dtype(old)
    return model, mode


def _peft(model, ft, fake: bool, dropout: float):
    import peft
    cfg = lora_config(ft, dropout)
    if not fake:
        return peft.get_peft_model(model, cfg, autocast_adapter_dtype=ft.adapter_dtype == "fp32").train()
    with _no_op_moves():
        model = peft.get_peft_model(model, cfg, autocast_adapter_dtype=False).train()
    if ft.adapter_dtype == "fp32":
        for name, mod in model.named_modules():
            if name.endswith((".lora_A.default", ".lora_B.default")):
                mod.weight = torch.nn.Parameter(mod.weight.float())
    return model


def make_ft_optimizer(model, ft, lr: float = 1e-3, weight_decay: float = 0.0):
    """The optimizer ``ft`` names, over the trainable parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    if ft.optimizer in ("adamw-8bit", "paged-adamw"):
        import bitsandbytes as bnb
        cls = (bnb.optim.PagedAdamW32bit if ft.optimizer == "paged-adamw" else
               bnb.optim.PagedAdamW8bit if ft.base_dtype == "nf4" else bnb.optim.AdamW8bit)
        return cls(params, lr=lr, weight_decay=weight_decay)
    if ft.adapter == "none" and ft.recipe in ("mixed", "mixed-ds"):
        return MasterWeightAdamW(params, lr=lr, weight_decay=weight_decay, fp32_grads=ft.recipe == "mixed-ds")
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=False)
