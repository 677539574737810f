"""DeepSpeed's own model-state estimators, run for real (CPU accelerator), beside ``mixed-ds``.

DeepSpeed counts 18 bytes per parameter (bf16 + fp32 gradients, fp32 master, m, v) and keeps
the bf16 parameters whole under ZeRO-2; under ZeRO-3 it adds 4 bytes x the largest layer for
the gathered parameters of the layer being computed. ``compare()`` puts its figures next to
``accounting.model_states(..., "mixed-ds")`` and names each difference.
"""

import contextlib
import io

from . import accounting, models


def _deepspeed():
    from deepspeed.runtime.zero.stage3 import (estimate_zero3_model_states_mem_needs,
                                               estimate_zero3_model_states_mem_needs_all_cold)
    from deepspeed.runtime.zero.stage_1_and_2 import (estimate_zero2_model_states_mem_needs,
                                                      estimate_zero2_model_states_mem_needs_all_cold)
    return (estimate_zero2_model_states_mem_needs, estimate_zero2_model_states_mem_needs_all_cold,
            estimate_zero3_model_states_mem_needs, estimate_zero3_model_states_mem_needs_all_cold)


def printed_tables(model: str, gpus: int = 8) -> str:
    """What DeepSpeed's ``..._all_cold`` estimators print for the model (both stages)."""
    cfg = models.get(model)
    _, zero2_cold, _, zero3_cold = _deepspeed()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        zero2_cold(total_params=cfg.n_params(), num_gpus_per_node=gpus, num_nodes=1)
        zero3_cold(total_params=cfg.n_params(), largest_layer_params=cfg.largest_layer_params(),
                   num_gpus_per_node=gpus, num_nodes=1)
    return buf.getvalue()


def compare(model: str, gpus: int = 8) -> list[dict]:
    """Per-GPU bytes without offload: DeepSpeed's estimate vs ours (mixed-ds), stages 2 and 3."""
    cfg = models.get(model)
    zero2, _, zero3, _ = _deepspeed()
    n, largest = cfg.n_params(), cfg.largest_layer_params()
    _, ds2 = zero2(n, num_gpus_per_node=gpus, num_nodes=1, cpu_offload=False)
    _, ds3, buffer = zero3(n, largest, num_gpus_per_node=gpus, num_nodes=1, cpu_offload=False,
                           cpu_offload_params=False)
    ours2 = accounting.model_states(n, "mixed-ds", gpus, 2).total
    ours3 = accounting.model_states(n, "mixed-ds", gpus, 3).total
    return [
        {"stage": 2, "deepspeed": ds2, "ours": ours2, "difference": ds2 - ours2,
         "why": "DeepSpeed adds the bf16 gradients (2 B, sharded) to the fp32 ones: 18 vs 16 sharded bytes"},
        {"stage": 3, "deepspeed": ds3, "ours": ours3, "difference": ds3 - ours3,
         "why": f"4 B x the largest layer ({largest / 1e9:.2f} B params: the embedding) for the gathered "
                f"layer, plus rounding; the 18 B/param sharded part equals ours (mixed-ds)"},
    ]
