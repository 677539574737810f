"""Names shared by the formulas and the traced model: attention kernels, checkpoint policies,
RMSNorm implementations and AdamW implementations.

Kept apart from ``llama`` and ``optim`` so that the accounting layer (``accounting``,
``activations``, ``estimate``) and the command line can use them without importing torch.
"""

from ..errors import one_of

KERNELS = ("flash", "naive", "eager")
POLICIES = ("none", "full", "every-2", "every-other", "selective")
# fused: saves its input and an fp32 1/rms per row (Apex, Transformer Engine, CUDA fused kernels);
# hf: Hugging Face's LlamaRMSNorm written in eager ops, which also saves an fp32 copy of the input
NORMS = ("fused", "hf")
# torch.optim.AdamW's three code paths: foreach=False (one tensor at a time), foreach=True (one
# op over every tensor: the default on CUDA), fused=True (one kernel, no workspace)
ADAMW_IMPLS = ("for-loop", "foreach", "fused")


def checkpoint_plan(policy: str, n_layers: int) -> list[list[int]]:
    """Group layer indices into checkpointed segments; layers in no segment run normally.

    ``full``: each layer its own segment. ``every-2``: segments of two consecutive layers.
    ``every-other``: layers 0, 2, 4, ... checkpointed alone, the rest not (torchtitan's
    ``selective_ac_option="2"``). ``none`` and ``selective``: no whole-layer segments.
    """
    one_of(policy, POLICIES, "checkpoint policy")
    if policy == "full":
        return [[i] for i in range(n_layers)]
    if policy == "every-2":
        return [list(range(i, min(i + 2, n_layers))) for i in range(0, n_layers, 2)]
    if policy == "every-other":
        return [[i] for i in range(0, n_layers, 2)]
    return []
