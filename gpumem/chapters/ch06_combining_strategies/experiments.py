"""Chapter 06's experiment ``plan-proof``: the planner picks a layout for a tiny model under a
memory budget, and its DeepSpeed config trains on CPU ranks; the bytes DeepSpeed holds on each
rank are set beside the plan's (the same code for the notebook and ``python -m gpumem run``).

The budget is per rank and the reserve is zero (CPU ranks have no CUDA context, NCCL buffers or
caching allocator). The default budget lies between what ZeRO-3 needs and what ZeRO-2 needs, so
only ZeRO-3 layouts fit and the planner must shard the parameters.
"""

from gpumem.memory import gpus, models
from gpumem import planner

PROOF_MODEL, PROOF_SEQ, PROOF_BATCH = "mini", 64, 4
NO_RESERVE = gpus.Reserve(context=0, nccl=0, fragmentation=0.0)
PARTS = ("params", "grads", "optimizer", "buffers")


def proof_plan(model: str = PROOF_MODEL, ranks: int = 2, budget: int | None = None) -> planner.Result:
    """The planner's answer for the proof: ``model`` on ``ranks`` CPU ranks within ``budget``
    bytes each (default: halfway between the smallest ZeRO-3 and the smallest ZeRO-2 layout)."""
    kw = dict(seq=PROOF_SEQ, global_batch=PROOF_BATCH, recipes=("mixed",), tp=(1,), pp=(1,),
              offloads=(("none", "cpu"),), reserve=NO_RESERVE)
    if budget is None:
        budget = (smallest(model, ranks, 3, kw) + smallest(model, ranks, 2, kw)) // 2
    return planner.plan(model, ranks, gpu_mem=budget, **kw)


def smallest(model: str, ranks: int, zero: int, kw: dict) -> int:
    """Bytes per rank of the smallest layout at ``zero`` (ranked over a roomy budget)."""
    r = planner.plan(model, ranks, gpu_mem=10**12, zero=(zero,), advise=False, **kw)
    return min(p.memory["total"] for p in r.plans)


def plan_proof(ranks: int = 2, device: str = "cpu", progress: bool = True, model: str = PROOF_MODEL,
               steps: int = 2) -> dict:
    """Plan, run the plan's DeepSpeed config on ``ranks`` ranks, and compare held bytes."""
    from gpumem.runs import launch
    result = proof_plan(model, ranks)
    best = result.best
    runs = launch.run("gpumem.chapters.ch06_combining_strategies.proof_ranks:run_plan", ranks, device,
                      deepspeed=True, progress=progress, model=model, config=best.deepspeed,
                      kernel=best.layout.attention, policy=best.layout.checkpoint, seq=PROOF_SEQ, steps=steps)
    planned = {k: best.memory[k] for k in PARTS}
    if best.layout.zero == 3:   # the planner counts ZeRO-3's reduce bucket inside its working set
        planned["buffers"] = reduce_bucket(model, best.layout)
    return {"model": model, "ranks": ranks, "device": device, "budget": result.question["usable"],
            "n_params": models.get(model).n_params(), "plan": best.layout.label(),
            "layout": best.as_dict()["layout"], "deepspeed": best.deepspeed, "planned": planned,
            "planned_total": best.memory["total"], "fitting": len(result.plans),
            "ranks_held": [{"rank": r["rank"], "measured": {k: r["held"][k] for k in PARTS},
                            "persistent": r["held"]["persistent"], "losses": r["losses"],
                            "peak_allocated": r["peak_allocated"]} for r in runs],   # CUDA ranks; None on CPU
            "tolerance": tolerance(model, ranks)}


def reduce_bucket(model: str, layout) -> int:
    """The reduce bucket's bytes in the planner's ZeRO-3 working set (``accounting.zero3_gathered``
    with the planner's bucket sizes): the part of it DeepSpeed allocates once and the proof reads."""
    from gpumem.memory import accounting
    from gpumem.planner import memory as planner_memory
    layers = planner_memory.layers_per_stage(models.get(model), layout.pp) if layout.pp > 1 else None
    return accounting.zero3_gathered(models.get(model), layout.recipe, planner_memory.DS_PREFETCH,
                                     planner_memory.DS_BUCKET, layout.tp, layers).reduce


def tolerance(model: str, ranks: int) -> dict:
    """Bytes by which DeepSpeed may exceed the plan per part: it pads each parameter tensor's
    partition to a whole share (up to ranks - 1 elements per tensor), the plan pads the flat
    total once. Bytes per element: bf16 parameters and gradients 2, fp32 master and moments 12."""
    from gpumem.memory.estimate import n_param_tensors
    pad = n_param_tensors(models.get(model)) * (ranks - 1)
    return {"params": 2 * pad, "grads": 2 * pad, "optimizer": 12 * pad, "buffers": 0}
