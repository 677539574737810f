"""Fine-tuning under FSDP (one unit per decoder block), with or without the frozen base on the CPU:
per-GPU bytes of the states and of FSDP's working set (chapter 08, ``plan --adapter``). Torch-free.

FSDP2 (``fully_shard`` on each block, then on the root) keeps each parameter's 1/dp shard and
gathers a unit's full weights into a new buffer before its forward and again before its backward,
freeing them after (``reshard_after_forward=True`` for the blocks). The root unit (embedding, head,
final norm) stays gathered from forward to backward (``reshard_after_forward`` None -> False for the
root: torch/distributed/fsdp/_fully_shard/_fully_shard.py). Counted: the shards
(``finetune.finetune_states`` at ZeRO stage 3), the root whole, and :data:`FSDP_BLOCKS` blocks'
weights and gradients whole (one computing, one prefetched; a block's gradients exist whole until
its reduce-scatter).

With the base on the CPU (FSDP2 ``offload_policy=CPUOffloadPolicy()``: "offloads parameters,
gradients, and optimizer states to CPU ... the optimizer step runs on CPU",
torch/distributed/fsdp/_fully_shard/_fsdp_api.py; DeepSpeed's twin is ZeRO-3 ``offload_param``)
the shards live in host memory and each rank copies its shard up before each gather: the blocks
cross PCIe :data:`FSDP_PASSES` times a micro-batch (forward, and backward, inside which a
checkpointed re-run happens), the root once a micro-batch (:func:`copied_up`). Assumptions, with their effect: QLoRA's quantisation constants stay on
the GPU (attributes, not parameters: FSDP moves only the flat parameters; 1.1 GB at 70B); the root
is not wrapped on its own (wrapping embedding and head apart would free 4.2 GB at 70B for most of
the step).
"""

from . import finetune as F

FSDP_BLOCKS = 2       # one block computing, one prefetched (FSDP2's default prefetch of one unit)
FSDP_PASSES = 2       # the blocks cross PCIe in forward and in backward


def fsdp_states(cfg, ft: F.Finetune, dp: int = 1, base_on_cpu: bool = False) -> dict:
    """Per-GPU bytes of a fine-tuning step under FSDP over ``dp`` ranks (activations apart):
    ``gpu`` (held on the GPU), ``host`` (host memory per GPU: the shards, with ``base_on_cpu``),
    ``roles`` (the shards by role, ``finetune_states`` at stage 3), ``root``, ``block`` and
    ``block_grads`` (one unit's weights and gradients, whole), ``working`` (the gathered root and
    blocks), ``streamed`` (bytes a GPU copies up a pass with ``base_on_cpu``: its shards of the
    blocks), ``root_streamed`` (its shard of the root, copied once a micro-batch) and ``passes``."""
    roles = F.finetune_states(cfg, ft, gpus=dp, zero=3)
    root, block, grads = F.root_weights(cfg, ft), F.block_weights(cfg, ft), F.block_grads(cfg, ft)
    working = root + FSDP_BLOCKS * (block + grads)
    resident = roles["quant_constants"] + roles["dequant_buffer"]
    shards = sum(roles.values()) - resident
    gpu = resident + working + (0 if base_on_cpu else shards)
    return {"gpu": gpu, "host": shards if base_on_cpu else 0, "roles": roles, "root": root, "block": block,
            "block_grads": grads, "working": working,
            "streamed": -(-block * cfg.n_layers // dp) if base_on_cpu else 0,
            "root_streamed": -(-root // dp) if base_on_cpu else 0, "passes": FSDP_PASSES}


def copied_up(o: dict, n_micro: int = 1) -> int:
    """Bytes one GPU copies host-to-device a step with the base on the CPU (``o``: :func:`fsdp_states`):
    each micro-batch gathers every block in forward and again in backward, and the root unit once
    (it stays gathered from its forward to its backward, then is freed)."""
    return n_micro * (o["passes"] * o["streamed"] + o["root_streamed"])
