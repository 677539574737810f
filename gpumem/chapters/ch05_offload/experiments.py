"""Chapter 05's experiment ``offload``, the same code for the notebook and ``python -m gpumem run``.

One call measures the bandwidth ladder, then trains the offload model under each configuration
on CPU ranks (one launch, :func:`gpumem.runs.ds_offload_ranks.offload_runs`) with the swap folder
made and removed around it, and sets the measurement beside chapter 01's formula and the cost
model (:mod:`gpumem.memory.offload_cost`) fed with the ladder. Without libaio the NVMe
configuration is skipped with the line that says how to install it.
"""

import os

from gpumem import scratch
from gpumem.runs import ds_offload, dsops, launch
from gpumem.errors import UsageError, one_of
from gpumem.memory import accounting, bandwidth
from gpumem.timing import offload_time
from gpumem.units import MiB

RECIPE = "mixed"     # bf16 weights and gradients, fp32 master and moments: what the runs train with
BASELINE = {1: "zero1", 2: "zero2", 3: "zero3"}


def _mean(rows: list[dict], key: str) -> dict:
    return {k: sum(r[key][k] for r in rows) / len(rows) for k in rows[0][key]}


def formula(n_params: int, ranks: int, name: str) -> dict[str, int]:
    """Chapter 01's per-rank bytes by device for one configuration (recipe ``mixed``)."""
    zero, offload, device = ds_offload.CONFIGS[name]
    s = accounting.model_states(n_params, RECIPE, ranks, zero, offload, device)
    return {"accelerator": s.total, "host": s.host, "nvme": s.nvme}


def predicted_vs_measured(out: dict, links: offload_time.Links) -> dict:
    """Per offload configuration: the cost model's terms (fed with the measured ladder and the
    baseline's measured forward + backward) beside their measured counterparts, and the ratio."""
    rows = {}
    for name, c in out["configs"].items():
        zero, offload, device = ds_offload.CONFIGS[name]
        base = out["configs"].get(BASELINE[zero])
        if offload == "none" or base is None:
            continue
        compute = base["seconds"]["forward"] + base["seconds"]["backward"]
        p = offload_time.step_time(out["n_params"], RECIPE, zero, out["ranks"], offload, device, compute, links,
                                   overlap=False)
        sec, swap = c["seconds"], c["swap_seconds"]
        m = {"compute": compute, "transfers": sec["forward"] + sec["backward"] - swap["forward"] - swap["backward"] - compute,
             "nvme": sum(swap.values()), "cpu_adam": sec["step"] - swap["step"], "total": sum(sec.values())}
        pred = {"compute": p["compute"], "transfers": p["h2d"] + p["d2h"], "nvme": p["nvme"],
                "cpu_adam": p["cpu_adam"], "total": p["total"]}
        # what offloading adds: the step minus the baseline's (the model's baseline is its compute
        # input: it prices no optimizer step on the device)
        over = {"predicted": p["total"] - compute, "measured": m["total"] - sum(base["seconds"].values())}
        over["ratio"] = over["predicted"] / over["measured"] if over["measured"] > 0 else None
        rows[name] = {"predicted": pred, "measured": m, "overhead": over,
                      "ratio": {k: (m[k] / pred[k] if pred[k] > 0 else None) for k in pred}}
    return rows


def offload(ranks: int = 2, device: str = "cpu", progress: bool = True, model: str | None = None,
            steps: int = 4, configs=tuple(ds_offload.CONFIGS), nvme_path: str | None = None,
            ladder_mib: int = 256, ladder: dict | None = None) -> dict:
    """The ladder, then every configuration: losses, per-rank bytes by device (measured and
    formula), swap files, the step-time breakdown, and the cost model's prediction of it.
    ``nvme_path`` (default: the temp folder) must be a writable folder with room for the ladder's
    file and the swap files (:func:`gpumem.runs.ds_offload.swap_bytes`), else UsageError before
    anything is written; a disk that fills up during the run ends in a one-line RunFailure."""
    if model is not None:
        raise UsageError(f"--model {model}: offload trains its own model ({ds_offload.MODEL.name}, whose "
                         "embedding shards are 1 MiB, DeepSpeed's smallest swappable tensor); leave --model out")
    one_of(device, ("cpu", "cuda"), "device")
    for name in configs:
        one_of(name, tuple(ds_offload.CONFIGS), "configuration")
    progress = progress and not os.environ.get("TQDM_DISABLE")   # bars off where tqdm is told so
    ready, why = ds_offload.nvme_ready()
    skipped = {n: why for n in configs if ds_offload.CONFIGS[n][2] == "nvme" and not ready}
    run_names = [n for n in configs if n not in skipped]
    need = _room(nvme_path, run_names, ranks, 0 if ladder else ladder_mib * MiB)   # before anything is written
    dsops.use_course_cache()                     # DeepSpeed's ops load from the course cache, never rebuild
    lad = ladder or bandwidth.ladder(nvme_path, ladder_mib * MiB, progress=progress, use_aio=ready)
    out = {"ranks": ranks, "device": device, "model": ds_offload.MODEL.name, "steps": steps, "recipe": RECIPE,
           "ladder": lad, "nvme": {"available": ready, "message": why}, "skipped": skipped, "configs": {}}
    if run_names:
        with ds_offload.swap_folder(nvme_path) as swap:
            try:
                res = launch.run("gpumem.runs.ds_offload_ranks:offload_runs", ranks, device, deepspeed=True,
                                 progress=progress, configs=tuple(run_names), swap_dir=str(swap), steps=steps)
            except Exception as err:
                full = ds_offload.full_disk(swap, need, err)    # the disk filled up under the ranks: one line
                if full is None:
                    raise
                raise full from err
        out["swap_folder_removed"] = not swap.exists()
        out["n_params"] = res[0][run_names[0]]["n_params"]
        for name in run_names:
            per = [r[name] for r in res]
            out["configs"][name] = {
                "zero": ds_offload.CONFIGS[name][0], "offload": ds_offload.CONFIGS[name][1],
                "offload_device": ds_offload.CONFIGS[name][2],
                "losses": [sum(p["losses"][i] for p in per) / ranks for i in range(steps)],
                "seconds": _mean(per, "seconds"), "swap_seconds": _mean(per, "swap_seconds"),
                "ranks": [{"rank": r, "held_by_role": p["held_by_role"], "swap_files": p["swap_files"],
                           "by_device": ds_offload.by_device(p["held_by_role"], name, p["swap_files"]["total"]),
                           "formula": formula(out["n_params"], ranks, name)} for r, p in enumerate(per)]}
        out["prediction"] = predicted_vs_measured(out, ladder_links(lad, device))
        out["loss_rel_diff"] = loss_differences(out)
    return out


def ladder_links(lad: dict, device: str) -> offload_time.Links:
    """The cost model's links fed with the measured ladder, for ranks on ``device``. A CPU rank's
    "accelerator" is host memory, so its transfers are RAM copies even where the machine has a GPU
    and the ladder PCIe rungs: those price CUDA ranks only (without them the RAM copy stands in)."""
    rates = bandwidth.rates(lad)
    if device != "cuda":
        rates = {k: v for k, v in rates.items() if not k.startswith(("h2d_", "d2h_", "d2d"))}
    adam = lad["cpu_adam"]["params_per_s"] if lad.get("cpu_adam") else 1e9
    return offload_time.links_from_ladder(rates, f"measured on {lad['machine']} {lad['date']}", adam)


def _room(nvme_path: str | None, run_names, ranks: int, ladder_bytes: int) -> int:
    """Refuse, before anything is written, a swap folder that is empty, missing, read-only or too
    small (after sweeping what killed runs left there); returns the swap bytes the run needs."""
    folder = bandwidth.writable_folder(nvme_path)
    for kind in (ds_offload.SWAP, bandwidth.LADDER):
        for line in scratch.sweep(kind, folder):
            bandwidth.stderr_note(line)
    swap = max([ds_offload.swap_bytes(n, folder, world=ranks) for n in run_names] + [0])
    option = "--nvme-path" if nvme_path is not None else "temp folder"
    if swap >= ladder_bytes and swap:
        names = "+".join(n for n in run_names if ds_offload.swap_files(n, world=ranks))
        bandwidth.check_room(folder, swap, f"swap files of {names} on {ranks} ranks", option)
    elif ladder_bytes:
        bandwidth.check_room(folder, ladder_bytes, "the bandwidth ladder's test file", option)
    return swap


def loss_differences(out: dict) -> dict[str, float]:
    """Largest relative loss difference of each offload configuration from its stage's baseline."""
    diffs = {}
    for name, c in out["configs"].items():
        base = out["configs"].get(BASELINE[c["zero"]])
        if c["offload"] != "none" and base:
            diffs[name] = max(abs(a - b) / abs(b) for a, b in zip(c["losses"], base["losses"]))
    return diffs


def gpu_reading(directory=None) -> str:
    """Each committed GPU run's copies (256 MiB, best of 5) beside the datasheet figures the time
    engine prices them with: the host link against the table's PCIe rate per direction, the copy
    inside the GPU (it reads and writes each byte: 2x the bytes copied) against HBM bandwidth."""
    from gpumem.course import gpu_results
    from gpumem.memory import gpus
    lines = []
    for run, got in gpu_results.values("05", directory):
        gpu = gpus.of_device(run["gpu"])
        if gpu is None or "ch05.h2d_pinned_bytes_per_s" not in got:
            continue
        lines.append(f"{run['gpu']} ({run['date']}), against the time engine's PCIe "
                     f"{gpu.pcie / 1e9:.1f} GB/s per direction:")
        for way in ("h2d", "d2h"):
            for kind in ("pinned", "pageable"):
                rate = got[f"ch05.{way}_{kind}_bytes_per_s"]
                lines.append(f"  {way} {kind:8s} {rate / 1e9:6.1f} GB/s  {rate / gpu.pcie:.2f} x the datasheet")
        traffic = 2 * got["ch05.d2d_bytes_per_s"]
        lines.append(f"  in the GPU  {traffic / 1e12:6.2f} TB/s read + written  {traffic / gpu.hbm:.2f} x its "
                     f"{gpu.hbm / 1e12:.1f} TB/s HBM")
    return "\n".join(lines) or "no GPU run of chapter 05 is committed"
