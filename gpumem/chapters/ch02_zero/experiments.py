"""Chapter 02's experiments, the same code for the notebook and ``python -m gpumem run NAME``.

Each returns plain data (JSON-ready). Ranks are CPU processes over gloo, or one per GPU with
``device="cuda"``. Registered in ``gpumem.chapters`` as ``zero`` and ``gather-trace``.
"""

from gpumem.runs import launch
from gpumem.memory import accounting


def zero(ranks: int = 2, device: str = "cpu", model: str = "tiny", steps: int = 3,
         deepspeed: bool = True, progress: bool = True) -> dict:
    """ZeRO 0-3 from scratch (measured bytes, formula, communication, losses), then DeepSpeed."""
    scratch = launch.run("gpumem.chapters.ch02_zero.scratch_ranks:from_scratch_stages", ranks, device, progress=progress,
                         model=model, steps=steps)
    n = scratch[0][0]["n_params"]
    out = {"model": model, "ranks": ranks, "device": device, "n_params": n,
           "largest_param": scratch[0][0]["largest_param"], "stages": {}}
    for stage in range(4):
        per_rank = [r[stage] for r in scratch]
        f = accounting.model_states(n, "fp32", ranks, stage)
        formula = {"params": f.params, "grads": f.grads, "optimizer": f.optimizer}
        volume = per_rank[0]["comm"]["per_step"]
        out["stages"][str(stage)] = {
            "ranks": [{"rank": r["rank"], "measured": r["bytes"], "formula": formula, "losses": r["losses"],
                       "cuda_max_memory_allocated": r["cuda_max_memory_allocated"]} for r in per_rank],
            "losses": [sum(r["losses"][i] for r in per_rank) / ranks for i in range(steps)],
            "comm_bytes_per_step": int(volume * 4),
            "comm_per_step_in_psi": round(volume / n, 4),
            "comm_calls": per_rank[0]["comm"]["calls"],          # over all the steps
            "comm_calls_per_step": {k: v / steps for k, v in per_rank[0]["comm"]["calls"].items()},
            "comm_in_psi_by_kind": {k: round(v / steps / n, 4) for k, v in per_rank[0]["comm"]["volume"].items()},
            "grad_peak_during_backward": per_rank[0]["grad_peak_during_backward"],
        }
    if deepspeed:
        ds = launch.run("gpumem.chapters.ch02_zero.ds_ranks:deepspeed_stages", ranks, device, deepspeed=True,
                        progress=progress, model=model, steps=steps)
        out["deepspeed"] = {str(stage): {
            "ranks": [{"rank": r, "held_elements": ds[r][stage]["held"], "losses": ds[r][stage]["losses"],
                       "cuda_max_memory_allocated": ds[r][stage]["cuda_max_memory_allocated"]}
                      for r in range(ranks)],
            "losses": [sum(ds[r][stage]["losses"][i] for r in range(ranks)) / ranks for i in range(steps)]}
            for stage in ds[0]}
    return out


def gather_trace(ranks: int = 2, device: str = "cpu", model: str = "mini", steps: int = 2,
                 progress: bool = True) -> dict:
    """DeepSpeed ZeRO-3's parameter fetches, all-gathers and releases (rank 0's view)."""
    res = launch.run("gpumem.chapters.ch02_zero.ds_ranks:gather_trace", ranks, device, deepspeed=True,
                     progress=progress, model=model, steps=steps)
    return {"model": model, "ranks": ranks, **{k: v for k, v in res[0].items() if k != "rank"}}
