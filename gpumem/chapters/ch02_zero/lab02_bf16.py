"""Lab 02's bf16 case: the learner's hooks on a model whose weights and gradients are bf16, one
backward on 2 CPU ranks; the shards must be the gradients reduced in fp32.

Summing N bf16 gradients in bf16 rounds every partial sum to bf16's 8 significant bits; DeepSpeed
reduces in the dtype its ``communication_data_type`` setting names (``"fp32"`` in the config; by
default the training dtype, bf16 here: ``DeepSpeedEngine.communication_data_type``,
``deepspeed/runtime/engine.py``). The grader checks the real reduced values: the grader's own hook,
registered before the learner's, keeps each rank's bf16 gradient as it arrives; the expected shard
is the fp32 sum of both ranks' gradients, divided by 2 (exact in fp32: two bf16 numbers add
exactly unless their exponents are 16 or more apart, and halving is exact), sliced rank-major. A
bucket reduced in bf16 and cast afterwards differs from it by up to half a bf16 step
(2**-9 of the value) in most elements.

The case runs on the ranks as the fp32 ones do (:func:`.lab02_ranks._case`, one backward, no step):
recorded, metered and held back (review r12 #6: it ran unwatched, with raw work handles), its
flat copies bound as fp32 copies of its elements (``labcheck._bf16_row``).
"""

import math

RTOL = 1e-6          # fp32 rounding of the rare sums that are not exact; a bf16 sum is off by up to 2**-9
ATOL = 1e-30


def label(case: tuple, world: int) -> str:
    """The bf16 row's case, as the report shows it."""
    model, seed, _, bucket = case
    return f"{model} in bf16, seed {seed}, bucket {bucket:,} B, {world} ranks: shards reduced in fp32, then bytes and overlap"


def row(results: list[dict], names: list[str], fp32_wrong: bool = False) -> tuple[str, str]:
    """(status, detail) of the bf16 row: an error the hooks raised on a rank, or :func:`grade`
    (``fp32_wrong``: an fp32 case's shard row is wrong)."""
    failed = next((f"rank {r}: {res['error']}" for r, res in enumerate(results) if "error" in res), None)
    if failed:
        return "error", f"your hooks raised on the bf16 model, {failed}"
    bad = grade(results, names, fp32_wrong)
    return ("wrong", bad) if bad else ("ok", "")


def grade(results: list[dict], names: list[str], fp32_wrong: bool = False) -> str | None:
    """The first shard that is not the fp32 mean of the ranks' bf16 gradients, or None; with what a
    wrong shard looks like (review r29 #3: a layout slip read as a dtype fault)."""
    import torch
    from .lab02_weights import why_wrong
    world = len(results)
    each = [[r["grads"].get(i) for r in results] for i in range(len(names))]
    means = [None if any(g is None for g in gs) else sum(g.float() for g in gs) / world for gs in each]
    for i, (name, got_grads, total) in enumerate(zip(names, each, means)):
        if total is None:
            continue
        c = math.ceil(total.numel() / world)
        flat = torch.nn.functional.pad(total.reshape(-1), (0, c * world - total.numel()))
        for r, res in enumerate(results):
            got, want = res["shards"].get(i), flat[r * c:(r + 1) * c]
            if got is None:
                return f"grad_shards has no entry for {name} (index {i}) on rank {r} when backward returns"
            if got.dtype != torch.float32:
                return (f"grad_shards[{i}] ({name}) is {str(got.dtype).replace('torch.', '')}: reduce in fp32 "
                        "(cast as you pack the bucket) and keep the fp32 result")
            if got.shape != want.shape:
                return f"grad_shards[{i}] ({name}) on rank {r}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
            if not torch.allclose(got, want, rtol=RTOL, atol=ATOL):
                rel = ((got - want).abs() / want.abs().clamp_min(1e-30)).max().item()
                why = ("; it is the bf16 sum of the ranks' gradients: the bucket went over the wire in bf16 "
                       "and was rounded at every addition, cast it to fp32 before the reduce-scatter"
                       if _bf16_sum(got, got_grads, r, c, world) else why_wrong(got, want, means, world, False)
                       or ("; an fp32 case's shards are wrong too: fix the fp32 shard rows first" if fp32_wrong
                           else ""))
                return f"first shard off the fp32 mean: {name} on rank {r}, largest relative error {rel:.2g}" + why
    return None


def _bf16_sum(got, grads: list, r: int, c: int, world: int) -> bool:
    """Whether ``got`` is rank ``r``'s shard of the ranks' gradients summed in bf16 (then averaged)."""
    import torch
    total = grads[0]
    for g in grads[1:]:
        total = total + g                              # bf16 + bf16: rounded to bf16, as gloo sums it
    flat = torch.nn.functional.pad(total.float().reshape(-1) / world, (0, c * world - total.numel()))
    return torch.allclose(got, flat[r * c:(r + 1) * c], rtol=RTOL, atol=ATOL)
