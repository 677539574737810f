"""Chapter 06's time-model cells: one all-gather on three group shapes (alpha-beta with
placement), the pipeline schedules side by side, and the note's slow-network rule on node types.
Every second comes from the time engine (:mod:`gpumem.timing`) or the planner; nothing is typed
here but the question's shape."""

import dataclasses
import textwrap

from gpumem import planner
from gpumem.course.quiz_draws import label
from gpumem.memory import gpus, models
from gpumem.planner import placement
from gpumem.timing import collectives, hardware, schedules, zero_layouts

# -- 1. one all-gather, three group shapes --------------------------------------------------

GATHER_MODEL = "llama-3-70b"


def gather_groups(node_name: str = "dgx-h100") -> list[tuple[str, hardware.Group]]:
    """The same collective's three placements on ``node_name`` nodes: 8 GPUs of one node, 8 GPUs
    one per node (stride 8, as a data-parallel group is when tp = 8), 64 GPUs filling 8 nodes."""
    node = hardware.node(node_name)
    per, eight = node.gpus_per_node, hardware.Cluster(node, 8)
    return [(f"{per} GPUs in one node", hardware.Cluster(node, 1).group(per)),
            (f"{per} GPUs, one per node (stride {per})", eight.group(per, stride=per)),
            (f"{8 * per} GPUs = 8 full nodes", eight.group(8 * per))]


def gather_bytes(model: str = GATHER_MODEL) -> int:
    """S: the model's bf16 weights, what ZeRO-3 all-gathers over one forward pass."""
    return 2 * models.get(model).n_params()


def gather_times(node_name: str = "dgx-h100", nbytes: float | None = None) -> list[tuple]:
    """(label, :class:`collectives.CollectiveTime`) for each shape of :func:`gather_groups`."""
    s = gather_bytes() if nbytes is None else nbytes
    return [(name, collectives.collective_time("all_gather", s, g)) for name, g in gather_groups(node_name)]


def alpha_beta_table(node_name: str = "dgx-h100", small: float = 1e6) -> str:
    """The all-gather of the 70B model's bf16 weights (and of ``small`` bytes, where latency
    rules) on each group shape: time, its latency part, the link that binds, bus bandwidth."""
    node, big = hardware.node(node_name), gather_bytes()
    lines = [f"all-gather of S = {big / 1e9:.1f} GB ({label(GATHER_MODEL)}'s bf16 weights) on "
             f"{node.label} nodes",
             f"{'group':34s} {'binds':>8s} {'time':>10s} {'latency':>8s} {'busbw':>9s} "
             f"{'S = ' + f'{small / 1e6:g} MB':>9s} {'latency':>8s}"]
    for (name, t), (_, s) in zip(gather_times(node_name), gather_times(node_name, small)):
        lines.append(f"{name:34s} {t.binding:>8s} {t.seconds * 1e3:>7,.1f} ms {t.latency_s * 1e6:>5.0f} us "
                     f"{t.busbw / 1e9:>4.0f} GB/s {s.seconds * 1e6:>6.0f} us {s.latency_s / s.seconds:>7.0%}")
    return "\n".join(lines)


def alpha_beta_sentence(node_name: str = "dgx-h100") -> str:
    """The comparison the prose draws, printed from the same numbers."""
    (_, one), (_, spread), (_, full) = gather_times(node_name)
    return textwrap.fill(
        f"One node: {one.seconds:.2f} s; eight full nodes: {full.seconds:.2f} s; the same eight ranks "
        f"one per node: {spread.seconds:.2f} s, {spread.seconds / one.seconds:.1f}x one node's.", 100)


# -- 2. pipeline schedules -----------------------------------------------------------------

SCHEDULES = (("GPipe", "gpipe", 1), ("1F1B", "1f1b", 1), ("interleaved 1F1B", "interleaved", 2),
             ("interleaved 1F1B", "interleaved", 4), ("ZB-H1", "zb-h1", 1), ("ZB-H2", "zb-h2", 1))


def p2p_bytes(model: str = GATHER_MODEL, tp: int = 8, seq: int = 4096) -> int:
    """One pipeline message of ``model`` at tensor parallelism ``tp`` with sequence parallelism."""
    cfg = models.get(model)
    return schedules.p2p_message_bytes(seq, 1, cfg.d_model, tp=tp, sequence_parallel=True)


def schedule_rows(p: int = 8, ms=(32, 8), F: float = 1.0, B: float = 2.0, W: float = 1.0) -> list:
    """(label, v, m, :class:`schedules.ScheduleResult` or the refusal's text) for each schedule;
    the zero-bubble schedules split ``W`` off the backward, the others do not split it."""
    msg, rows = p2p_bytes(), []
    for m in ms:
        for name, key, v in SCHEDULES:
            try:
                r = schedules.schedule(key, p, m, v, F, B, W if key.startswith("zb") else 0.0, msg)
            except Exception as err:          # noqa: BLE001 -- a UsageError: shown as the refusal
                r = str(err)
            rows.append((name, v, m, r))
    return rows


def schedule_table(p: int = 8, ms=(32, 8)) -> str:
    """Bubble, first stage's micro-batches in flight and p2p volume of each schedule."""
    msg = p2p_bytes()
    lines = [f"p = {p} stages; per micro-batch and stage F = 1, B = 2 (zero-bubble schedules split B into",
             "input gradient 1 + weight gradient W = 1);",
             f"p2p message {msg / 1e6:.1f} MB ({label(GATHER_MODEL)}, tp = 8, sequence parallel, "
             "4,096 tokens)",
             f"{'schedule':18s} {'v':>2s} {'m':>3s} {'bubble':>8s} {'idle':>7s} {'first stage':>12s} "
             f"{'p2p sends':>10s} {'p2p MB':>8s}",
             f"{'':18s} {'':>2s} {'':>3s} {'/compute':>8s} {'/step':>7s} {'holds (mb)':>12s} "
             f"{'per step':>10s} {'per step':>8s}"]
    notes = []
    for name, v, m, r in schedule_rows(p, ms):
        if isinstance(r, str):
            lines.append(f"{name:18s} {v:>2d} {m:>3d}  refused: {r.split(' (')[0]}")
            continue
        lines.append(f"{name:18s} {v:>2d} {m:>3d} {r.bubble_fraction:>7.1%} {r.idle_fraction:>7.1%} "
                     f"{r.in_flight_first:>12.2f} {r.p2p_sends:>10d} {r.p2p_bytes / 1e6:>8,.0f}")
        if r.step_time_synced != r.step_time:
            synced = (r.step_time_synced - m * 3.0) / (m * 3.0)
            notes.append(textwrap.fill(
                f"{name}, m = {m}: {r.bubble_fraction:.1%} counts consecutive steps as overlapping; "
                f"with an optimizer step that waits for all stages, {synced:.1%}", 100))
    return "\n".join(lines + notes)


# -- 3. the note's slow-network rule on node types -----------------------------------------

SLOW_GPU, SLOW_MODEL, SLOW_GPUS, SLOW_BATCH, SLOW_SEQ = "a100-40gb", "llama-3-8b", 16, 64, 4096
TEN_GBE = 10 * hardware.Gbps   # assumption: the note's "Ethernet", one 10 Gb/s port per node


def networks() -> list[tuple[str, hardware.NodeType]]:
    """The GPU's own node (DGX A100: eight 200 Gb/s HDR NICs) and the same node with one Ethernet
    port shared by its eight GPUs, at the rate of the 100 Gb/s NIC of the ``g2-l4x8`` node type,
    of chapter 02/07's 25 Gb/s cluster (``zero_layouts.ETHERNET_25G``), and of a 10 GbE port
    (:data:`TEN_GBE`, an assumption)."""
    dgx = placement.node_for(gpus.get(SLOW_GPU))
    one_port = [(hardware.node("g2-l4x8").nic_bw, "g2-l4x8's NIC"),
                (zero_layouts.ETHERNET_25G.nic_bw, "ETHERNET_25G"), (TEN_GBE, "assumption")]
    out = [(f"{dgx.nics} x {dgx.nic_bw * 8 / 1e9:.0f} Gb/s {dgx.fabric} per node ({dgx.name.split('/')[0]})", dgx)]
    for bw, why in one_port:
        node = dataclasses.replace(dgx, nics=1, nic_bw=bw, fabric="Ethernet")
        out.append((f"1 x {bw * 8 / 1e9:.0f} Gb/s Ethernet per node ({why})", node))
    return out


def slow_plan(node: hardware.NodeType):
    """The planner on ``node``'s network: its NICs' line rate shared by the node's GPUs, given as
    ``inter_node`` (exact here: with tp = 1 every data-parallel ring fills whole nodes)."""
    return planner.plan(SLOW_MODEL, SLOW_GPUS, SLOW_GPU, seq=SLOW_SEQ, global_batch=SLOW_BATCH,
                        recipes=("mixed",), tp=(1,), pp=(1,), inter_node=placement.per_gpu_network(node))


def slow_layouts(node: hardware.NodeType) -> dict:
    """The four sharding layouts on 2 nodes of ``node`` (``zero_layouts.layout_step``): 4
    micro-batches of 4,096 tokens per GPU, no checkpointing or offload."""
    cluster = hardware.Cluster(node, SLOW_GPUS // node.gpus_per_node)
    micro = SLOW_BATCH // SLOW_GPUS
    return {lay: zero_layouts.layout_step(lay, SLOW_MODEL, cluster, micro, SLOW_SEQ)
            for lay in zero_layouts.LAYOUTS}


def slow_network_table() -> str:
    """The planner's best layout per network, then each sharding layout's exposed communication."""
    nets = networks()
    lines = [f"{label(SLOW_MODEL)} on {SLOW_GPUS} x A100 40GB in 2 nodes, {SLOW_BATCH} sequences of "
             f"{SLOW_SEQ:,} a step, data parallelism only", "planner's best layout per network:"]
    for name, node in nets:
        b = slow_plan(node).best
        lines += [f"  {name}: {b.time['total']:.2f} s/step; data-parallel {b.time['data_parallel_moved_s']:.2f} s, "
                  f"{b.time['data_parallel']:.2f} s exposed", f"      {b.layout.label()}"]
    heads = {"zero3": "ZeRO-3", "hpz": "hpZ", "mics": "MiCS/HSDP", "zero1": "ZeRO-1"}
    micro = SLOW_BATCH // SLOW_GPUS
    lines += [f"exposed communication per step, s (zero_layouts: {micro} micro-batches of {SLOW_SEQ:,} "
              "tokens, no checkpointing):", f"  {'network':48s}" + "".join(f"{h:>10s}" for h in heads.values())]
    for name, node in nets:
        r = slow_layouts(node)
        lines.append(f"  {name:48s}" + "".join(f"{r[k]['exposed_s']:>10.2f}" for k in heads))
    states = slow_layouts(nets[0][1])
    lines.append(f"  {'model states per GPU, GB':48s}" + "".join(
        f"{states[k]['states_bytes'] / 1e9:>10.1f}" for k in heads))
    return "\n".join(lines)
