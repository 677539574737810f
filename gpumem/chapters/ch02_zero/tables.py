"""Chapter 02's text tables beyond the run summaries: the peak gradient bytes per stage, the
gather trace by the phase each gather serves, ZeRO-3's time on two links, DeepSpeed's own
estimators (cleaned for reading) and the frameworks' names for each stage."""

import contextlib
import io
import logging
import re

from gpumem import units
from gpumem.dist import gradmeter, zero3_cost, zero3_schedule
from gpumem.memory import ds_estimators, models


def grad_peak_table(result: dict, model: str = "llama-3-70b", gpus: int = 8, bucket: int = 500_000_000) -> str:
    """Measured peak of gradient bytes during backward per stage (from scratch), and the same
    bound for a 70B model in bf16 with DeepSpeed's default reduce bucket (5e8 elements)."""
    lines = [f"{result['model']}, {result['ranks']} ranks, fp32: peak gradient bytes during backward "
             "(measured on the live tensors)",
             f"{'stage':6s} {'full gradients':>15s} {'+ shards kept':>15s}   after the step"]
    for stage, row in result["stages"].items():
        p = row["grad_peak_during_backward"]
        lines.append(f"{stage:6s} {p['full_grads']:>15,d} {p['full_grads_and_shards']:>15,d}   "
                     f"{row['ranks'][0]['measured']['grads']:>10,d}")
    sizes = [n for own in zero3_schedule.llama_params(models.get(model)).values() for _, n in own]
    lines.append(f"{model}, {gpus} GPUs, bf16 gradients, reduce bucket {bucket:.0e} elements:")
    for stage in (1, 2):
        b = gradmeter.peak_bound(sizes, gpus, stage, 2, 2 * bucket if stage == 2 else 0)
        lines.append(f"  ZeRO-{stage}: full gradients {'=' if stage == 1 else '<='} {units.fmt(b['full_grads']):>9s}"
                     f", shards {units.fmt(b['shards']):>8s}, peak {units.fmt(b['total'])}")
    return "\n".join(lines)


def gather_phase_table(trace: dict) -> str:
    """Per step, the bytes all-gathered by the phase that issues them and by the phase they
    serve, in units of psi, with DeepSpeed's schedule for Llama-3-70B beside them."""
    psi = 4 * models.get(trace["model"]).n_params()
    lines = [f"{'':8s} {'issued in':^19s} {'serves':^19s} {'after the':>10s}",
             f"{'step':8s} {'forward':>9s} {'backward':>9s} {'forward':>9s} {'backward':>9s} {'step':>10s}  in psi"]
    for step, c in trace["counts"].items():
        issued = {ph: sum(e["bytes"] for e in trace["events"] if e["event"] == "all-gather"
                          and f"step{e['step']}" == step and e["phase"] == ph) for ph in ("forward", "backward")}
        lines.append(f"{step:8s} {issued['forward'] / psi:>9.3f} {issued['backward'] / psi:>9.3f} "
                     f"{c['gathered_for']['forward'] / psi:>9.3f} {c['gathered_for']['backward'] / psi:>9.3f} "
                     f"{c['after_step_bytes'] / psi:>10.4f}")
    v = zero3_schedule.step_volume("llama-3-70b")
    g, s = v["gathered_elements"], v["served_elements"]
    n = v["n_params"]
    lines.append(f"{'70B':8s} {g['forward'] / n:>9.3f} {g['backward'] / n:>9.3f} {s['forward'] / n - g['step'] / n:>9.3f} "
                 f"{s['backward'] / n:>9.3f} {g['step'] / n:>10.4f}  (DeepSpeed's defaults, replayed)")
    return "\n".join(lines)


def time_table(model: str = "llama-3-70b", gpus: int = 8, gpu: str = "h100-80gb",
               tokens=(1024, 4096, 16384), links=("nvlink", "inter-node")) -> str:
    """ZeRO-3's communication against compute per micro-batch, per link and tokens per GPU."""
    first = zero3_cost.zero3_step_time(model, gpus, gpu, links[0], tokens_per_gpu=tokens[0])
    lines = [f"{model} on {gpus} x {first['gpu']}, ZeRO-3 in bf16, {first['gathered_psi']:.3f} psi gathered + "
             f"1 psi reduce-scattered per step; compute at {first['mfu']:.0%} MFU of "
             f"{first['bf16_flops'] / 1e12:.0f} TFLOP/s",
             f"{'link (per direction)':22s} {'tokens':>7s} {'comm s':>8s} {'compute s':>10s} "
             f"{'fwd hidden':>10s} {'bwd hidden':>10s} {'exposed s':>9s}"]
    for link in links:
        for t in tokens:
            r = zero3_cost.zero3_step_time(model, gpus, gpu, link, tokens_per_gpu=t)
            name = f"{link} {r['link_bytes_per_s'] / units.GB:.0f} GB/s"
            lines.append(f"{name:22s} {t:>7,d} {r['comm_s']:>8.2f} {r['compute_s']:>10.2f} "
                         f"{'yes' if r['phases']['forward']['hidden'] else 'no':>10s} "
                         f"{'yes' if r['phases']['backward']['hidden'] else 'no':>10s} {r['exposed_s']:>9.2f}")
        lines.append(f"{'':22s} break-even at {r['break_even_tokens']:,.0f} tokens per GPU per micro-batch")
    lines.append(f"bytes each GPU sends (and receives) per micro-batch: {units.fmt(r['bytes_moved'])}")
    return "\n".join(lines)


_LOG_LINE = re.compile(r"^\[[^\]]*\] \[(WARNING|INFO|DEBUG)\].*$", re.MULTILINE)


def _quiet_deepspeed() -> None:
    """Import DeepSpeed with its import-time chatter swallowed, then keep its logger to errors."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        import deepspeed  # noqa: F401
        from deepspeed.accelerator import get_accelerator
        get_accelerator()
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)


def estimator_tables(model: str = "llama-3-70b", gpus: int = 8) -> str:
    """DeepSpeed's ``..._all_cold`` estimator tables as printed, for reading: log lines dropped,
    enum reprs as their values, and DeepSpeed's "GB" (it divides by 2^30) labelled GiB."""
    _quiet_deepspeed()
    text = _LOG_LINE.sub("", ds_estimators.printed_tables(model, gpus))
    text = re.sub(r"OffloadDeviceEnum\.(\w+)", r"\1", text)
    text = re.sub(r"(\d)GB", r"\1GiB", text).replace("  per CPU  |  per GPU |", "  per CPU   |  per GPU  |")
    return "\n".join(line for line in text.splitlines() if line.strip())


def estimator_compare_table(model: str = "llama-3-70b", gpus: int = 8) -> str:
    """DeepSpeed's per-GPU estimate next to ours (recipe mixed-ds), stages 2 and 3, and why they differ."""
    _quiet_deepspeed()
    lines = [f"{'stage':6s} {'DeepSpeed':>10s} {'ours':>10s} {'difference':>11s}  why"]
    for r in ds_estimators.compare(model, gpus):
        lines.append(f"ZeRO-{r['stage']} {units.fmt(r['deepspeed']):>10s} {units.fmt(r['ours']):>10s} "
                     f"{units.fmt(r['difference']):>11s}  {r['why']}")
    return "\n".join(lines)


FRAMEWORKS = [
    ("ZeRO-0 (DDP)", [("DeepSpeed", '"zero_optimization": {"stage": 0}'),
                      ("PyTorch", "DistributedDataParallel; FSDP ShardingStrategy.NO_SHARD; FSDP2 replicate()"),
                      ("Megatron-Core", "DistributedDataParallel (the default)")]),
    ("ZeRO-1", [("DeepSpeed", '"stage": 1'),
                ("PyTorch", "torch.distributed.optim.ZeroRedundancyOptimizer (no FSDP strategy)"),
                ("Megatron-Core", "--use-distributed-optimizer (optimizer states and fp32 main grads sharded); "
                                  "Megatron-FSDP --data-parallel-sharding-strategy optim")]),
    ("ZeRO-2", [("DeepSpeed", '"stage": 2'),
                ("PyTorch", "FSDP ShardingStrategy.SHARD_GRAD_OP; FSDP2 fully_shard(reshard_after_forward=False): "
                            "parameters stay gathered from forward to backward"),
                ("Megatron-Core", "Megatron-FSDP --data-parallel-sharding-strategy optim_grads")]),
    ("ZeRO-3", [("DeepSpeed", '"stage": 3, stage3_* keys'),
                ("PyTorch", "FSDP ShardingStrategy.FULL_SHARD; FSDP2 fully_shard() (reshard_after_forward=True, "
                            "the default); HYBRID_SHARD = ZeRO-3 inside a node, DDP across nodes"),
                ("Megatron-Core", "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params")]),
]


def frameworks_table(width: int = 96) -> str:
    """The same four stages under the names DeepSpeed, PyTorch and Megatron-Core give them."""
    import textwrap
    lines = []
    for stage, rows in FRAMEWORKS:
        for i, (fw, name) in enumerate(rows):
            wrapped = textwrap.wrap(name, width - 29)
            lines.append(f"{stage if i == 0 else '':13s} {fw:14s} {wrapped[0]}")
            lines += [f"{'':28s} {more}" for more in wrapped[1:]]
    return "\n".join(lines)


def fit_table(names=("llama-3-8b", "llama-3-70b", "llama-3.1-405b"), gpu_counts=(8, 64), recipe: str = "mixed",
              gpu: str = "h100-80gb") -> str:
    """Model states per GPU for each ZeRO stage, against what one GPU may use (capacity minus
    the stated reserve): the memory side of sharding at 8B, 70B and 405B."""
    from gpumem.memory import accounting, gpus as gpu_table
    usable = gpu_table.usable(gpu)
    lines = [f"model states per GPU, recipe {recipe}; one {gpu_table.get(gpu).label} may use "
             f"{units.fmt(usable)} (reports {units.fmt(gpu_table.get(gpu).capacity)} minus the reserve)",
             f"{'model':15s} {'GPUs':>5s} {'DDP':>11s} {'ZeRO-1':>11s} {'ZeRO-2':>11s} {'ZeRO-3':>11s}"]
    for name in names:
        n = models.get(name).n_params()
        for g in gpu_counts:
            cells = []
            for stage in range(4):
                total = accounting.model_states(n, recipe, g, stage).total
                cells.append(f"{units.fmt(total)}{'*' if total <= usable else ' '}")
            lines.append(f"{name:15s} {g:>5d} " + " ".join(f"{c:>11s}" for c in cells))
    lines.append("* = the states alone fit one GPU's usable memory (activations and buffers still to come)")
    return "\n".join(lines)
