"""Chapter 05's figures: the ladder (measured beside quoted), per-device stacked bars against the
formula, step-time stacked bars, and the 70B step's cost terms as tokens per step grow."""

from gpumem.course.drawing import show_figures as show  # noqa: F401  (notebooks call plots.show)
from gpumem.memory import gpus
from gpumem.timing import offload_time

GB = 1e9
DRIVE = offload_time.NVME_DRIVES["gen4"]   # the cost model's datacenter drive
QUOTED = [("note: GPU HBM", 3.5e12, "note"), ("H100 SXM HBM (datasheet)", gpus.get("h100-80gb").hbm, "datasheet"),
          ("DDR5-4800 socket, 8 ch", 307e9, "datasheet"), ("note: 'CPU RAM (PCIe)'", 100e9, "note"),
          ("PCIe Gen5 x16, per direction", 63e9, "datasheet"), ("PCIe Gen4 x16, per direction", 31.5e9, "datasheet"),
          (f"NVMe Gen4 read ({DRIVE.name})", DRIVE.read, "datasheet"),
          (f"NVMe Gen4 write ({DRIVE.name})", DRIVE.write, "datasheet"),
          ("note: NVMe SSD", 5e9, "note")]
COLORS = {"measured": "tab:blue", "datasheet": "tab:gray", "note": "tab:orange"}


def ladder(ladder_result: dict):
    """Horizontal bars, log scale: this machine's rungs beside datasheet and note figures."""
    import matplotlib.pyplot as plt
    rows = [(f"measured: {k}", v["bytes_per_s"], "measured") for k, v in ladder_result["rungs"].items()] + QUOTED
    rows.sort(key=lambda r: r[1])
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 1))
    ax.barh([r[0] for r in rows], [r[1] / GB for r in rows], color=[COLORS[r[2]] for r in rows])
    ax.set_xscale("log")
    ax.set_xlabel("GB/s (10^9 bytes per second, log scale)")
    ax.set_title("bandwidth ladder: blue measured here, grey datasheet, orange the note")
    fig.tight_layout()
    return fig


def held(result: dict):
    """Stacked bars per configuration (rank 0): accelerator, host and NVMe bytes, measured beside
    chapter 01's formula."""
    import matplotlib.pyplot as plt
    names = list(result["configs"])
    fig, ax = plt.subplots(figsize=(9, 4))
    for i, name in enumerate(names):
        r = result["configs"][name]["ranks"][0]
        for j, (label, row) in enumerate((("measured", r["by_device"]), ("formula", r["formula"]))):
            bottom = 0.0
            for k, color in (("accelerator", "tab:green"), ("host", "tab:blue"), ("nvme", "tab:red")):
                ax.bar(i + 0.38 * j, row[k] / 1e6, 0.36, bottom=bottom, color=color,
                       hatch="//" if label == "formula" else None, edgecolor="white",
                       label=f"{k} ({label})" if i == 0 else None)
                bottom += row[k] / 1e6
    ax.set_xticks([i + 0.19 for i in range(len(names))], names)
    ax.set_ylabel("bytes per rank (MB = 10^6 B)")
    ax.set_title("what each device holds: measured (solid) and formula (hatched)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def times(result: dict):
    """Stacked bars per configuration: forward, backward and step compute, and swap I/O (ms)."""
    import matplotlib.pyplot as plt
    names = list(result["configs"])
    fig, ax = plt.subplots(figsize=(8, 4))
    for i, name in enumerate(names):
        s, w = result["configs"][name]["seconds"], result["configs"][name]["swap_seconds"]
        parts = [("forward", s["forward"] - w["forward"]), ("backward", s["backward"] - w["backward"]),
                 ("step", s["step"] - w["step"]), ("swap I/O", sum(w.values()))]
        bottom = 0.0
        for (label, v), color in zip(parts, ("tab:green", "tab:olive", "tab:blue", "tab:red")):
            ax.bar(i, 1e3 * v, bottom=bottom, color=color, label=label if i == 0 else None)
            bottom += 1e3 * v
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("milliseconds per step (fastest step, mean over ranks)")
    ax.set_title("step-time breakdown, measured")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def scale(n_params: int, links: offload_time.Links, flops: float, mfu: float, tokens: list[int],
          cases: list[tuple[str, int, str, str]], gpus_n: int = 8):
    """Step seconds (the best schedule, solid: offload_time.ideal_schedule, which keeps NVMe state
    swaps in the step; stock DeepSpeed's schedule, dotted) against tokens per rank per step, one line
    per offload case ``(label, zero, offload, device)``, with the compute line."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4))
    compute = [offload_time.compute_seconds(n_params, t, flops, mfu) for t in tokens]
    ax.plot(tokens, compute, "k--", label="compute alone")
    for label, zero, offload, device in cases:
        rs = [offload_time.step_time(n_params, "mixed", zero, gpus_n, offload, device, c, links) for c in compute]
        best = (", best schedule (NVMe state swaps stay in the step)" if device == "nvme"
                else ", ideal overlap (delayed update)")
        line, = ax.plot(tokens, [r["total"] for r in rs], label=label + best)
        ax.plot(tokens, [r["stock"] for r in rs], ":", color=line.get_color(), label=label + ", stock DeepSpeed")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens per GPU per step (log scale)")
    ax.set_ylabel("seconds per step (log scale)")
    ax.set_title("70B on 8 GPUs: where offload stops being transfer-bound")
    ax.legend(fontsize=7, loc="lower right")   # every line rises to the right: that corner stays empty
    fig.tight_layout()
    return fig
