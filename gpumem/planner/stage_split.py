"""How a pipeline's stages share a model's layers when the stage count does not divide them.

When pp does not divide L, every stage holds ceil(L / pp) layers except that the missing layers
are taken one each from the end stages: the first stage first, then the last, then the second
and the second-to-last, inwards. For Llama 3.1 405B's 126 layers over 16 stages that is
7 + 14 x 8 + 7. Llama 3 balances its pipeline by taking one Transformer layer off the first and
one off the last stage, the stages that also hold the embedding and the output head with the loss
(arXiv:2407.21783, section 3.3.2, "Pipeline parallelism"; there with an interleaved schedule,
so the first chunk holds only the embedding and the last only the head and loss). Megatron-Core
sets such a split with ``num_layers_in_first_pipeline_stage`` / ``num_layers_in_last_pipeline_stage``
(``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``). Beyond one
layer off each end stage, the inward order is the planner's assumption.
"""

from functools import lru_cache

from ..memory.models import ModelConfig


@lru_cache(maxsize=4096)
def stage_layers(cfg: ModelConfig, pp: int) -> tuple[int, ...]:
    """Layers of each pipeline stage of ``cfg``, first to last."""
    if pp <= 1:
        return (cfg.n_layers,)
    full = -(-cfg.n_layers // pp)
    short = pp * full - cfg.n_layers            # < pp, so every stage keeps >= 1 layer
    lead = -(-short // 2)
    return tuple(full - (i < lead) - (pp - 1 - i < short - lead) for i in range(pp))


def split_text(split: tuple[int, ...]) -> str:
    """A split in words: ``7 + 14 x 8 + 7``."""
    runs: list[list[int]] = []
    for n in split:
        if runs and runs[-1][1] == n:
            runs[-1][0] += 1
        else:
            runs.append([1, n])
    return " + ".join(str(n) if k == 1 else f"{k} x {n}" for k, n in runs)


@lru_cache(maxsize=4096)
def middle_stage(cfg: ModelConfig, pp: int) -> int | None:
    """The first middle stage holding more layers than the first stage (uneven splits; the
    stage after a shorter first stage keeps one micro-batch fewer in flight, of more layers), else None."""
    split = stage_layers(cfg, pp)
    if pp < 3 or split[0] == max(split):
        return None
    return next(i for i in range(1, pp - 1) if split[i] == max(split))
