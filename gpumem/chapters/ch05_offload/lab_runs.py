"""Lab 05's real run: DeepSpeed's ZeRO-3 NVMe offload of a model the lab never shows, on CPU ranks.

:func:`swap_run` builds the model from its dimensions, trains it for one step under a
``zero3+nvme`` config (:func:`gpumem.runs.ds_offload.offload_config`, with the ``aio`` block size
the grader names) and returns the swap files its rank wrote (:func:`gpumem.runs.ds_offload.inventory`),
read while the engine is alive; the swap folder is made and removed by the parent
(:func:`gpumem.runs.ds_offload.swap_folder`). Nothing in DeepSpeed is replaced.
"""

import contextlib
import io
import logging

import torch

from ...memory.llama import Llama
from ...memory.models import ModelConfig
from ...runs import ds_offload
from ...runs.training import batches


def nvme_config(cfg: ModelConfig, swap_dir: str, block_bytes: int, world: int = 2) -> dict:
    """The chapter's ``zero3+nvme`` config for ``cfg`` on ``world`` ranks, with ``aio.block_size``
    ``block_bytes`` (DeepSpeed swaps only tensors of at least max(1 MiB, block_size) bytes)."""
    out = ds_offload.offload_config("zero3+nvme", swap_dir, 1, cfg=cfg, world=world)
    out["aio"]["block_size"] = block_bytes
    for key in ("offload_optimizer", "offload_param"):     # CPU ranks, also on a GPU machine: nothing to pin
        out["zero_optimization"][key]["pin_memory"] = False
    return out


def swap_run(rank: int, world: int, models: dict, swap_dir: str, seq: int = 8, seed: int = 0) -> dict:
    """For each ``label -> (ModelConfig, block_bytes)`` of ``models``: one training step under
    ZeRO-3 with optimizer and parameters on NVMe, then this rank's swap files (name -> bytes)."""
    import deepspeed
    torch.set_num_threads(1)
    out = {}
    for i, (label, (cfg, block)) in enumerate(models.items()):
        folder = f"{swap_dir}/{i}"
        torch.manual_seed(seed)
        net = Llama(cfg)
        with contextlib.redirect_stdout(io.StringIO()):
            engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(),
                                              config=nvme_config(cfg, folder, block, world))
        logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
        data = batches(cfg, 1, world, seq, seed)[0, rank:rank + 1].to(engine.device)
        loss = engine(data[:, :-1], data[:, 1:])
        engine.backward(loss)
        engine.step()
        out[label] = ds_offload.inventory(folder).get(rank, {"files": {}})["files"]
        engine.destroy()
    return out
