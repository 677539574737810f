"""Chapter 02's text tables beyond the run summaries: the peak gradient bytes per stage, the
gather trace by the phase each gather serves, ZeRO-3's time on three group shapes and the
sharding layouts per step (the time engine), DeepSpeed's own estimators (cleaned for reading)
and the frameworks' names for each stage."""

import contextlib
import io
import logging
import re

from gpumem import units
from gpumem.runs import gradmeter, zero3_schedule
from gpumem.timing import zero3_cost
from gpumem.memory import ds_estimators, models
from gpumem.memory import gpus as gpu_table


def grad_peak_table(result: dict, model: str = "llama-3-70b", gpus: int = 8, bucket: int = 500_000_000) -> str:
    """Measured peak of gradient bytes during backward per stage (from scratch), and the same
    bound for a 70B model in bf16 with DeepSpeed's default reduce bucket (5e8 elements), plus
    the fp32 copy of its gradient shard that DeepSpeed's ZeRO-2 makes at the optimizer step."""
    lines = [f"{result['model']}, {result['ranks']} ranks, fp32: peak gradient bytes during backward, "
             "measured on the live tensors",
             f"{'stage':6s} {'full gradients':>15s} {'+ shards kept':>15s}   after the step"]
    for stage, row in result["stages"].items():
        p = row["grad_peak_during_backward"]
        lines.append(f"{stage:6s} {p['full_grads']:>15,d} {p['full_grads_and_shards']:>15,d}   "
                     f"{row['ranks'][0]['measured']['grads']:>10,d}")
    cfg = models.get(model)
    sizes = [n for own in zero3_schedule.llama_params(cfg).values() for _, n in own]
    lines += [f"{model}, {gpus} GPUs, bf16 gradients, DeepSpeed's reduce bucket (reduce_bucket_size)",
              f"  {bucket:,} elements = {units.fmt(2 * bucket)} of bf16:"]
    for stage in (1, 2):
        b = gradmeter.peak_bound(sizes, gpus, stage, 2, 2 * bucket if stage == 2 else 0)
        bound = "=" if stage == 1 else "<="
        lines.append(f"  ZeRO-{stage}: full gradients {bound} {units.fmt(b['full_grads']):>9s}"
                     f", shards {bound} {units.fmt(b['shards']):>8s}, peak {bound} {units.fmt(b['total'])}")
    lines.append("  (ZeRO-2's is an upper bound: a bucket just short of full, the largest gradient arriving,")
    lines.append("  every shard already kept)")
    fp32 = 4 * -(-cfg.n_params() // gpus)
    lines.append("  at the optimizer step DeepSpeed's ZeRO-2 copies the gradient shard to fp32 for the update")
    lines.append(f"  (the fp32 gradients of its estimator): 4 B x psi/{gpus} = {units.fmt(fp32)} more")
    return "\n".join(lines)


SHAPES = (("nvlink", 8), ("full-nodes", 64), ("rank-per-node", 8))   # the group shapes time_table shows


def time_table(model: str = "llama-3-70b", gpu: str = "h100-80gb", tokens=(1024, 4096, 16384),
               shapes=SHAPES) -> str:
    """ZeRO-3's communication against compute per micro-batch, per pass, for each group shape
    (placement, GPUs) on the GPU's node type, from the time engine: the binding link and the
    break-even tokens per GPU; then the break-even in closed form, and the share of FLOPs that
    6 x psi x tokens leaves out (the attention scores)."""
    from gpumem.timing import compute
    node = zero3_cost.node_of(gpu)
    first = zero3_cost.zero3_step_time(model, shapes[0][1], gpu, shapes[0][0], tokens_per_gpu=tokens[0])
    lines = [f"{model}, ZeRO-3 on {node.label} nodes, bf16: per step {first['gathered_psi']:.3f} psi "
             "gathered + 1 psi reduce-scattered",
             f"compute 6 x psi x tokens at {first['mfu']:.0%} of {first['bf16_flops'] / 1e12:.0f} TFLOP/s, the share "
             "kernels reach while computing",
             "(timing.compute.KERNEL_SHARE, as the planner prices it); each collective timed on its placement",
             f"{'':34s} {'tokens':>7s} {'forward, s':^17s} {'backward, s':^17s} {'exposed':>8s}",
             f"{'group':34s} {'per GPU':>7s} {'comm':>8s} {'compute':>8s} {'comm':>8s} {'compute':>8s} "
             f"{'comm, s':>8s}"]
    for link, gpus in shapes:
        for t in tokens:
            r = zero3_cost.zero3_step_time(model, gpus, gpu, link, tokens_per_gpu=t)
            f, b = r["phases"]["forward"], r["phases"]["backward"]
            mark = lambda ph: "" if ph["hidden"] else "!"
            lines.append(f"{r['placement'].split(' of ')[0]:34s} {t:>7,d} {f['comm_s']:>7.2f}{mark(f):1s} "
                         f"{f['compute_s']:>8.2f} {b['comm_s']:>7.2f}{mark(b):1s} {b['compute_s']:>8.2f} "
                         f"{r['exposed_s']:>8.2f}")
        g = zero3_cost.placed_group(gpu, gpus, link)
        nics = f", {node.nics_for(g.ranks_per_node)} NIC(s) per node" if g.nodes > 1 else ""
        lines.append(f"  binds: {r['binding']}{nics}; each GPU's share moves at "
                     f"{r['link_bytes_per_s'] / units.GB:.0f} GB/s; break-even {r['break_even_tokens']:,.0f} tokens")
    lines.append("! = that pass's communication exceeds its compute: not hidden by prefetching")
    lines.append(f"bytes each GPU sends (and receives) per micro-batch: {units.fmt(first['bytes_moved'])} "
                 f"on {shapes[0][1]} GPUs")
    bare = zero3_cost.zero3_step_time(model, shapes[0][1], gpu, shapes[0][0], tokens_per_gpu=tokens[0],
                                      latency=False)
    f = bare["phases"]["forward"]
    per_param, rate = f["bytes_moved"] / models.get(model).n_params(), bare["link_bytes_per_s"]
    flops = first["mfu"] * first["bf16_flops"]
    lines.append(f"break-even, forward binds, latency aside: {per_param:.2f} B moved per param / 2 FLOPs "
                 "per param per token")
    lines.append(f"  x {flops / 1e12:.1f} TFLOP/s / {rate / units.GB:.0f} GB/s achieved = "
                 f"{per_param / 2 * flops / rate:,.0f} tokens ({shapes[0][0]})")
    cfg = models.get(model)
    seq = 4096
    extra = compute.attention_flops(cfg, seq) / compute.train_flops(cfg.n_params(), seq)
    lines.append(f"6 x psi x tokens leaves out the attention scores: +{extra:.1%} FLOPs at {seq:,} tokens per "
                 "sequence,")
    lines.append("  a little more compute to hide behind")
    return "\n".join(lines)


def break_even_words(model: str = "llama-3-70b", gpu: str = "h100-80gb", shapes=SHAPES) -> str:
    """The break-even of each group shape of :func:`time_table` in one sentence, for the prose."""
    import textwrap
    r = [zero3_cost.zero3_step_time(model, gpus, gpu, link) for link, gpus in shapes]
    at = [f"{x['break_even_tokens']:,.0f}" for x in r]
    return textwrap.fill(f"Per GPU per micro-batch, ZeRO-3 hides its traffic from {at[0]} tokens in one "
                         f"node, from {at[1]} on {shapes[1][1] // 8} whole nodes, and only from {at[2]} "
                         f"with one rank per node, where each GPU's share moves at "
                         f"{r[2]['link_bytes_per_s'] / units.GB:.0f} GB/s.", 100)


def layouts_table(model: str = "llama-3-8b", nodes: int = 8, micro_batches: int = 8,
                  tokens_per_gpu: int = 4096) -> str:
    """The data-parallel sharding layouts (:mod:`gpumem.timing.zero_layouts`) per optimizer step of
    ``micro_batches`` micro-batches, on DGX H100 nodes and on the same nodes with one 25 Gb/s port."""
    from gpumem.timing import hardware, zero_layouts
    lines = [f"{model} on {nodes} nodes x 8 H100, {micro_batches} micro-batches of {tokens_per_gpu:,} "
             "tokens per GPU per step",
             f"{'layout':47s} {'states':>8s} {'comm, s':>7s} {'comm, s':>8s} {'exposed':>8s} {'step':>6s}",
             f"{'':47s} {'per GPU':>8s} {'per mb':>7s} {'per step':>8s} {'s/step':>8s} {'s':>6s}"]
    for node in (hardware.node("dgx-h100"), zero_layouts.ETHERNET_25G):
        cluster = hardware.Cluster(node, nodes)
        lines.append(f"{node.label}: {node.nics} x {node.nic_bw * 8 / units.GB:.0f} Gb/s NIC(s) per node")
        for layout in zero_layouts.LAYOUTS:
            r = zero_layouts.layout_step(layout, model, cluster, micro_batches, tokens_per_gpu)
            lines.append(f"  {r['words']:45s} {units.fmt(r['states_bytes']):>8s} "
                         f"{r['comm_per_micro_batch_s']:>7.2f} {r['comm_per_step_s']:>8.2f} "
                         f"{r['exposed_s']:>8.2f} {r['step_s']:>6.2f}")
    lines += ["states: model states per GPU, mixed precision (16 B per parameter sharded as the layout",
              "shards); per mb: collectives of each micro-batch, hidden behind its pass where they can be;",
              "per step: the once-per-step collectives, counted exposed"]
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
    enum reprs as their values, DeepSpeed's "GB" (it divides by 2^30) labelled GiB, and each
    block headed by its stage and function."""
    _quiet_deepspeed()
    text = _LOG_LINE.sub("", ds_estimators.printed_tables(model, gpus))
    text = re.sub(r"OffloadDeviceEnum\.(\w+)", r"\1", text)
    text = re.sub(r"(\d)GB", r"\1GiB", text).replace("  per CPU  |  per GPU |", "  per CPU   |  per GPU  |")
    heads = iter(["ZeRO-2, estimate_zero2_model_states_mem_needs_all_cold: params, optimizer states and gradients",
                  "ZeRO-3, estimate_zero3_model_states_mem_needs_all_cold: params, optimizer states and gradients"])
    text = re.sub(r"Estimated memory needed for params, optim states and gradients for a:", lambda m: next(heads), text)
    return "\n".join(line for line in text.splitlines() if line.strip())


def estimator_compare_table(model: str = "llama-3-70b", gpus: int = 8) -> str:
    """DeepSpeed's per-GPU estimate (no offload) next to the course's recipes, part by part in
    bytes per parameter: what stays whole on every GPU, what is sharded over the GPUs, and the
    total, so that the three figures of each stage reconcile."""
    from gpumem.memory import accounting
    _quiet_deepspeed()
    cfg = models.get(model)
    n, largest = cfg.n_params(), cfg.largest_layer_params()
    ds = {r["stage"]: r["deepspeed"] for r in ds_estimators.compare(model, gpus)}
    dtype = {2: "bf16", 4: "fp32"}

    def course(recipe: str, stage: int) -> tuple:
        r = accounting.recipe(recipe)
        grads = f"{r.grads} {dtype[r.grads]} grads + {r.optimizer_bytes} opt."
        if stage == 2:
            whole, sharded = f"{r.params} bf16 params", f"{grads} = {r.grads + r.optimizer_bytes}"
        else:
            whole, sharded = "-", f"{r.params} params + {grads} = {r.total}"
        return (stage, f"course, {recipe}", whole, sharded, units.fmt(accounting.model_states(n, recipe, gpus, stage).total))
    rows = [  # (stage, source, whole on every GPU, sharded over the GPUs, per GPU)
        course("mixed", 2), course("mixed-ds", 2),
        (2, "DeepSpeed", "2 bf16 params", "2 bf16 + 4 fp32 grads + 12 opt. = 18", units.fmt(ds[2])),
        course("mixed", 3), course("mixed-ds", 3),
        (3, "DeepSpeed", f"4 B x {largest / 1e9:.2f} B largest layer", "18 (one figure, not itemised)",
         units.fmt(ds[3])),
    ]
    lines = [f"{model} on {gpus} GPUs, no offload: bytes per parameter whole on every GPU, and sharded",
             f"over the {gpus} (each GPU holds 1/{gpus})",
             f"{'stage':6s} {'who':16s} {'whole':27s} {'sharded':38s} {'per GPU':>9s}"]
    for stage, who, whole, sharded, total in rows:
        lines.append(f"ZeRO-{stage} {who:16s} {whole:27s} {sharded:38s} {total:>9s}")
    lines += ["opt. = optimizer: fp32 master 4 + Adam's m 4 + v 4; 'course, mixed' is the recipe of the boxes",
              f"DeepSpeed ZeRO-2 = 2 psi + 18 psi / {gpus}; ZeRO-3 = 18 psi / {gpus} + 4 x its largest layer,",
              "  a budget for the gathered layer"]
    return "\n".join(lines)


FRAMEWORKS = [
    ("ZeRO-0 (DDP)", [("DeepSpeed", '"zero_optimization": {"stage": 0}'),
                      ("PyTorch", "DistributedDataParallel; FSDP ShardingStrategy.NO_SHARD; "
                                  "torch.distributed._composable.replicate (composable DDP, a private API)"),
                      ("Megatron-Core", "DistributedDataParallel (the default)")]),
    ("ZeRO-1", [("DeepSpeed", '"stage": 1'),
                ("PyTorch", "torch.distributed.optim.ZeroRedundancyOptimizer (no FSDP strategy)"),
                ("Megatron-Core", "--use-distributed-optimizer: fp32 main params and Adam moments sharded "
                                  "(12/d B), bf16 params and fp32 main grads whole on every rank (6 B): "
                                  "6 + 12/d B per parameter, ZeRO-1 with a reduce-scatter; "
                                  "Megatron-FSDP --data-parallel-sharding-strategy optim")]),
    ("ZeRO-2", [("DeepSpeed", '"stage": 2 (refused with pipeline parallelism)'),
                ("PyTorch", "FSDP ShardingStrategy.SHARD_GRAD_OP; FSDP2 fully_shard(reshard_after_forward=False): "
                            "parameters stay gathered from forward to backward"),
                ("Megatron-Core", "Megatron-FSDP --data-parallel-sharding-strategy optim_grads")]),
    ("ZeRO-3", [("DeepSpeed", '"stage": 3, stage3_* keys (refused with pipeline parallelism)'),
                ("PyTorch", "FSDP ShardingStrategy.FULL_SHARD; FSDP2 fully_shard(reshard_after_forward=True); "
                            "its default None means True for every module but the root, False for the root "
                            "(needed first in backward); an int k reshards to groups of k ranks (e.g. a node); "
                            "HYBRID_SHARD = ZeRO-3 inside a node, DDP across nodes"),
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
    from gpumem.memory import accounting
    usable = gpu_table.usable(gpu)
    lines = [f"model states per GPU, recipe {recipe}; one {gpu_table.get(gpu).label} may use {units.fmt(usable)}",
             f"(it reports {units.fmt(gpu_table.get(gpu).capacity)}, minus the reserve)",
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


def gpus_table() -> str:
    """The course's GPU table (``gpumem.memory.gpus``) in the columns this chapter uses, no wider
    than 100 characters: capacity as reported and usable after the reserve, bf16 peak, links."""
    import textwrap

    from gpumem.memory.gpus import DEFAULT_RESERVE, REGISTRY, TB
    lines = [f"{'gpu':10s} {'as sold':16s} {'reports':>11s} {'in GB':>8s} {'usable':>8s} {'bf16':>7s} "
             f"{'HBM':>10s} {'NVLink/dir':>10s} {'PCIe/dir':>9s}"]
    for g in REGISTRY.values():
        bf16 = f"{g.bf16_flops / 1e12:.0f} TF" if g.bf16_flops else "none"
        link = f"{g.nvlink / units.GB:.0f} GB/s" if g.nvlink else "-"
        lines.append(f"{g.name:10s} {g.label:16s} {g.capacity // units.MiB:>7,d} MiB {g.capacity / units.GB:>5.1f} GB "
                     f"{gpu_table.usable(g) / units.GB:>5.1f} GB {bf16:>7s} {g.hbm / TB:>5.2f} TB/s {link:>10s} "
                     f"{g.pcie / units.GB:>4.1f} GB/s")
    lines += textwrap.wrap("usable = reports - reserve; reserve = " + DEFAULT_RESERVE.describe(), 96,
                           subsequent_indent="  ")
    lines.append("GB = 10^9 bytes; bf16: dense tensor-core peak; links: per direction")
    lines.append("sources: capacity as nvidia-smi reports it, speeds from NVIDIA's datasheets (gpumem/memory/gpus.py)")
    return "\n".join(lines)



DS_REDUCE_BUCKET = 500_000_000     # elements: DeepSpeed 0.19.8's reduce_bucket_size default (runtime/zero/config.py)


def gpu_bucket_lines(directory=None) -> str:
    """Each committed GPU run's DeepSpeed ZeRO-1/2/3 peak on rank 0 above ZeRO-0's (the chapter's
    fp32 ``mini`` run, 0.84 M parameters) beside the reduce bucket by hand: the default
    reduce_bucket_size x 4 B of fp32 gradient, allocated whole whatever the model's size."""
    from gpumem.course import gpu_results
    bucket = DS_REDUCE_BUCKET * 4
    lines = []
    for run, got in gpu_results.values("02", directory):
        key = "ch02.deepspeed_{}_rank0_cuda_max_memory_allocated"
        if key.format(0) not in got:
            continue
        base = got[key.format(0)]
        lines += [f"{run['gpu']} ({run['date']}): ZeRO-0 peaked at {units.fmt_both(base, 2)}; above it,",
                  f"  against reduce_bucket_size x 4 B = {units.fmt_both(bucket, 2)}:"]
        lines += [f"  ZeRO-{s}: +{units.fmt(got[key.format(s)] - base, digits=2)} "
                  f"({(got[key.format(s)] - base) / bucket:.3f} x the bucket)"
                  for s in (1, 2, 3) if key.format(s) in got]
    return "\n".join(lines) or "no GPU run of chapter 02 is committed: nothing measured to compare"
