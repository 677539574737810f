"""Chapter 05's tables: the ladder, what each device holds, the step-time breakdown, and the cost
model's prediction beside the measurement, all rendered from an ``offload`` result."""

from gpumem import units
from gpumem.memory import bandwidth

GB = units.GB


def ladder_table(ladder: dict) -> str:
    """The measured rungs in GB/s, with how each was measured."""
    lines = [f"bandwidth ladder measured on {ladder['machine']}, {ladder['date']} (GB = 10^9 bytes)"]
    for name, r in ladder["rungs"].items():
        lines.append(f"  {name:13s} {r['bytes_per_s'] / GB:8.2f} GB/s   {r['how']}")
    if not ladder.get("cuda"):
        lines.append("  (no CUDA device: the PCIe and HBM rungs are measured on a GPU machine only)")
    if ladder.get("cpu_adam"):
        a = ladder["cpu_adam"]
        lines.append(f"  cpu adam      {a['params_per_s'] / 1e9:8.3f} G params/s ({a['how']}, {a['threads']} thread)")
    return "\n".join(lines)


def held_table(result: dict) -> str:
    """Rank 0's bytes on each device per configuration: measured, then chapter 01's formula."""
    lines = [f"{'configuration':13s} {'':9s} {'accelerator':>12s} {'host':>10s} {'NVMe':>10s}   (MB = 10^6 bytes)"]
    for name, c in result["configs"].items():
        r = c["ranks"][0]
        for label, row in (("measured", r["by_device"]), ("formula", r["formula"])):
            lines.append(f"{name if label == 'measured' else '':13s} {label:9s} "
                         + " ".join(f"{row[k] / 1e6:>10.2f} MB"[-13:] for k in ("accelerator", "host", "nvme")))
    return "\n".join(lines)


def time_table(result: dict) -> str:
    """Milliseconds per step (mean over ranks of each rank's fastest step after the first): forward, backward,
    optimizer step, and the part of them spent on swap I/O."""
    lines = [f"{'configuration':13s} {'forward':>9s} {'backward':>9s} {'step':>9s} {'swap':>9s} {'total':>9s}  (ms)"]
    for name, c in result["configs"].items():
        s, w = c["seconds"], sum(c["swap_seconds"].values())
        lines.append(f"{name:13s} " + " ".join(f"{1e3 * v:9.1f}" for v in (s["forward"], s["backward"], s["step"], w,
                                                                             sum(s.values()))))
    lines.append("swap: time inside DeepSpeed's swapper calls, already part of forward, backward and step")
    return "\n".join(lines)


NOISE = 0.05    # a measured difference under 5 % of the baseline's forward + backward is read as noise


def prediction_table(result: dict) -> str:
    """The cost model (fed with the measured ladder) beside the measurement, per term, and the
    ratio measured / predicted. ``compute`` is an input (the baseline's measured forward + backward);
    a measured ``transfers`` difference at or under ``NOISE`` of it prints as "below noise". Then,
    per configuration, the total beside the *offload overhead* (step time minus the baseline's)."""
    lines = [f"{'configuration':13s} {'term':10s} {'predicted':>10s} {'measured':>11s} {'meas/pred':>9s}  (ms)"]
    rows = result.get("prediction", {})
    for name, row in rows.items():
        floor = NOISE * row["measured"]["compute"]
        for term in ("compute", "transfers", "nvme", "cpu_adam", "total"):
            ratio, got = row["ratio"][term], row["measured"][term]
            if term == "compute":
                shown, ratio = "(input)", None
            elif term == "transfers" and got <= floor:
                shown, ratio = "below noise", None
            else:
                shown = f"{1e3 * got:.2f}"
            lines.append(f"{name:13s} {term:10s} {1e3 * row['predicted'][term]:10.2f} {shown:>11s} "
                         f"{'-' if ratio is None else f'{ratio:.2f}':>9s}")
            name = ""
    lines.append("compute: the baseline's measured forward + backward, fed to the model;")
    lines.append(f"transfers: the offload run's forward + backward minus it (below noise: <= {100 * NOISE:.0f} % "
                 "of compute)")
    lines += ["", f"{'configuration':13s} {'total':>9s} {'total':>9s} {'meas/':>6s}   {'overhead':>9s} "
                  f"{'overhead':>9s} {'pred/':>6s}   (ms)",
              f"{'':13s} {'predicted':>9s} {'measured':>9s} {'pred':>6s}   {'predicted':>9s} {'measured':>9s} "
              f"{'meas':>6s}"]
    fmt = lambda v: "-" if v is None else f"{v:.2f}"   # noqa: E731
    for name, row in rows.items():
        o = row["overhead"]
        lines.append(f"{name:13s} {1e3 * row['predicted']['total']:9.2f} {1e3 * row['measured']['total']:9.2f} "
                     f"{fmt(row['ratio']['total']):>6s}   {1e3 * o['predicted']:9.2f} {1e3 * o['measured']:9.2f} "
                     f"{fmt(o['ratio']):>6s}")
    lines.append("overhead: step time minus the same stage's baseline without offload (measured: its whole "
                 "step;\n  the model prices no optimizer step on the device); '-': the offload run was not slower")
    return "\n".join(lines)


def offload_table(result: dict) -> str:
    """Everything ``python -m gpumem run offload`` prints."""
    parts = [ladder_table(result["ladder"])]
    for name, why in result.get("skipped", {}).items():
        parts.append(f"skipped {name}: {why}")
    if result["configs"]:
        parts += [f"{result['model']}: {result['n_params']:,} parameters, {result['ranks']} ranks, "
                  f"{result['steps']} steps, bf16 with fp32 master (recipe {result['recipe']})",
                  held_table(result), time_table(result), prediction_table(result),
                  "largest relative loss difference from the run without offload: "
                  + ", ".join(f"{k} {v:.1e}" for k, v in result["loss_rel_diff"].items()),
                  f"swap folder removed after the run: {result['swap_folder_removed']}"]
    return "\n\n".join(parts)


__all__ = ["ladder_table", "held_table", "time_table", "prediction_table", "offload_table", "bandwidth"]


def flow_diagram(n_params: int, gpus: int, recipe: str = "mixed") -> str:
    """Who holds what and what crosses which link per step, ZeRO-2 and ZeRO-3 with the optimizer on
    the CPU and ZeRO-3 with everything on NVMe, bytes per GPU from the cost model's traffic count
    (as DeepSpeed 0.19.8 moves them, one micro-batch per step; the paper's trip beside ZeRO-3's)."""
    from gpumem.memory import accounting, offload_cost
    parts = lambda zero, offload, device, grads="deepspeed": offload_cost.traffic_parts(  # noqa: E731
        n_params, recipe, zero, gpus, offload, device, grads)
    z2, cpu, paper = parts(2, "optimizer", "cpu"), parts(3, "optimizer", "cpu"), parts(3, "optimizer", "cpu", "paper")
    inf = parts(3, "optimizer+params", "nvme")
    s = accounting.shard(n_params, gpus)
    p16, g32 = accounting.recipe(recipe).params, accounting.optimizer_grad_bytes(accounting.recipe(recipe))
    g = lambda b: units.fmt(b, "GB", 1)   # noqa: E731
    return "\n".join([
        f"per GPU and step, {n_params / 1e9:.1f} B params on {gpus} GPUs, shard s = {s:,} parameters (GB = 10^9 B)",
        "ZeRO-Offload at stage 2 (optimizer on the CPU):",
        "  GPU (HBM): bf16 parameters, reduce buckets   CPU (DRAM): fp32 grads, master, m, v",
        f"     backward -- fp32 on the GPU -- fp32 gradient shard {g(z2['grad_down']):>9s} -- PCIe down --> CPU Adam",
        f"     next forward <-- bf16 parameter shard {g(z2['param_update']):>9s} -- PCIe up ------",
        "ZeRO-Offload at stage 3 (optimizer on the CPU), as DeepSpeed 0.19.8 runs it:",
        "  GPU (HBM): bf16 parameter shard   CPU (DRAM): bf16 gradient partition, fp32 grads, master, m, v",
        f"     backward -- 1. bf16 gradient partition {g(p16 * s):>9s} -- PCIe down --> host buffer",
        f"              <- 2. the same partition back {g(cpu['grad_up']):>9s} -- PCIe up ---- (widened to fp32 on the GPU)",
        f"              -- 3. fp32 gradient partition {g(cpu['grad_down'] - p16 * s):>9s} -- PCIe down --> CPU Adam",
        f"     next forward <-- bf16 parameter shard {g(cpu['param_update']):>9s} -- PCIe up ------",
        f"     per step: {g(cpu['grad_down'])} down, {g(cpu['grad_up'] + cpu['param_update'])} up; "
        f"the ZeRO-Offload paper's design: {g(paper['grad_down'])} down, {g(paper['param_update'])} up",
        "ZeRO-Infinity (stage 3, optimizer and parameters on NVMe):",
        "  GPU: only the layer being computed   CPU: staging buffers, bf16 grads   NVMe: 18 B x shard",
        f"     fwd + bwd, prefetched <-- params, twice {g(inf['param_fetch']):>9s} -- PCIe up <-- NVMe read "
        f"{g(inf['nvme_param_read']):>9s}",
        f"     backward -- the gradient trip above, {g(inf['grad_down'])} down; its fp32 part --> NVMe write "
        f"{g(g32 * s):>9s}",
        f"     step (nothing overlaps it): NVMe read {g(inf['nvme_state_read']):>9s} --> CPU Adam --> NVMe write "
        f"{g(inf['nvme_write'] - g32 * s):>9s}",
        "     NVMe read  = fp32 master, m, v 12 s + fp32 gradient 4 s (step) + bf16 params twice 4 s = 20 s",
        "     NVMe write = fp32 gradient 4 s (backward) + master, m, v 12 s + bf16 params 2 s = 18 s",
    ])


def scenario_table(rows: list[dict], seq: int) -> str:
    """The section 3 scenarios (``scenarios.rows``): bytes per GPU with one checkpointed sequence,
    host bytes per GPU, and the sequences (and tokens) per GPU that fit."""
    lines = [f"ZeRO-3, mixed recipe, sequences of {seq:,} tokens, H100 80GB "
             f"(usable {units.fmt(rows[0]['usable'])}; GB = 10^9 B)",
             f"{'model':12s} {'GPUs':>4s}  {'offload to the CPU':19s} {'GPU, 1 seq':>10s} {'host/GPU':>9s}"
             f" {'seqs, no ckpt':>13s} {'seqs, full ckpt':>15s} {'tokens/GPU':>10s}"]
    for r in rows:
        lines.append(f"{r['model']:12s} {r['gpus']:>4d}  {r['offload']:19s} {units.fmt(r['gpu_bytes']):>10s} "
                     f"{units.fmt(r['host_bytes']):>9s} {r['fit_none']:>13d} {r['fit_full']:>15d} "
                     f"{r['fit_full'] * seq:>10,d}")
    return "\n".join(lines)
