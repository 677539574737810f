"""Names shared by the formulas and the traced model: attention kernels and checkpoint policies.

Kept apart from ``llama`` so that the accounting layer (``accounting``, ``activations``,
``estimate``) can use them without importing torch.
"""

from ..errors import one_of

KERNELS = ("flash", "naive", "eager")
POLICIES = ("none", "full", "every-2", "every-other", "selective")


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
