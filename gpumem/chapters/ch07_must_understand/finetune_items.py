"""Chapter 08's entry in item 6 (which combination for which model): on one GPU, the note's rule
is "quantisation + CPU offload"; chapter 08 counts which fine-tuning recipe fits a 70B model on
one 80 GB card without offload. The figures come from ``gpumem.memory.finetune`` (the states by
role and the activations of a frozen base) against one GPU's usable bytes (``gpus.usable`` with
no NCCL reserve, as chapter 08's ``scale.usable``).
"""

from gpumem.course.quiz import Choice
from gpumem.memory import finetune as F, gpus, models
from gpumem.units import GB

from . import pointers as P

SEQ = 2048
# option text -> (setup, checkpoint policy); the order is the authored order of the options
SETUPS = {
    "Full fine-tuning with 8-bit AdamW, every layer checkpointed": (F.Finetune(optimizer="adamw-8bit"), "full"),
    "LoRA r16 on the bf16 base, every layer checkpointed": (F.Finetune(adapter="lora"), "full"),
    "QLoRA r16 on the NF4 base, no checkpointing at all": (F.Finetune(adapter="lora", base_dtype="nf4"), "none"),
    "QLoRA r16 on the NF4 base, every layer checkpointed": (F.Finetune(adapter="lora", base_dtype="nf4"), "full"),
}


def usable() -> int:
    """One H100 80GB's bytes for tensors: capacity minus the CUDA context and 5 %, no NCCL."""
    return gpus.usable(gpus.get("h100-80gb").capacity, gpus.Reserve(nccl=0))


def totals() -> dict[str, int]:
    """Option -> one GPU's bytes for a step of Llama-3-70B: model states + activations (peak)."""
    cfg = models.get("llama-3-70b")
    return {opt: sum(F.finetune_states(cfg, ft).values())
            + F.finetune_activation_bytes(cfg, ft, SEQ, 1, checkpoint=ck)["peak"]
            for opt, (ft, ck) in SETUPS.items()}


def _explain(_ctx) -> str:
    t = totals()
    short = ("full 8-bit AdamW, checkpointed", "LoRA, checkpointed", "QLoRA, not checkpointed",
             "QLoRA, checkpointed")
    parts = "; ".join(f"{name} {b / GB:.1f} GB" for name, b in zip(short, t.values()))
    return (f"One step of {SEQ:,} tokens against the {usable() / GB:.1f} GB usable: {parts}. A frozen base "
            "drops its gradients and optimizer states, NF4 shrinks its 2 bytes to about half a byte, but "
            "the activations of 80 layers still need checkpointing.")


QUESTION = Choice(
    "finetune-70b-one-gpu",
    "Llama-3-70B must be fine-tuned on one H100 80GB without any offload, one sequence of 2,048 "
    "tokens per step. Which recipe fits?",
    list(SETUPS), answer=3,
    hint="Which states does a frozen base still need, and at how many bytes per weight? Then add the "
         "activations of 80 layers, with and without checkpointing.",
    explanation=_explain)
SEE = {"finetune-70b-one-gpu": (P.FINETUNE_SCALE,)}
