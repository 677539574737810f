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
from gpumem.timing import collectives, compute, hardware, schedules, zero_layouts

# -- 1. one all-gather, three group shapes --------------------------------------------------

GATHER_MODEL = "llama-3-70b"
PROTOCOL = {"simple": "Simple", "LL": "LL"}


def gather_groups(node_name: str = "dgx-h100") -> list[tuple[str, hardware.Group]]:
    """The same collective's three placements on ``node_name`` nodes: 8 GPUs of one node, 8 GPUs
    one per node (ranks 0, 8, 16, ...: a data-parallel group when tp = 8), 64 GPUs filling 8 nodes."""
    node = hardware.node(node_name)
    per, eight = node.gpus_per_node, hardware.Cluster(node, 8)
    return [(f"{per} GPUs in one node: ranks 0-{per - 1}", hardware.Cluster(node, 1).group(per)),
            (f"{per} GPUs, one per node: 0, {per}, {2 * per}, ...", eight.group(per, stride=per)),
            (f"{8 * per} GPUs = 8 full nodes: 0-{8 * per - 1}", eight.group(8 * per))]


def gather_bytes(model: str = GATHER_MODEL) -> int:
    """S: the model's bf16 weights, what ZeRO-3 all-gathers over one forward pass."""
    return 2 * models.get(model).n_params()


def gather_times(node_name: str = "dgx-h100", nbytes: float | None = None) -> list[tuple]:
    """(label, :class:`collectives.CollectiveTime`) for each shape of :func:`gather_groups`."""
    s = gather_bytes() if nbytes is None else nbytes
    return [(name, collectives.collective_time("all_gather", s, g)) for name, g in gather_groups(node_name)]


def latency_constants() -> str:
    """NCCL's ring latencies and protocol shares as the engine holds them (``collectives``)."""
    base, hw, share = collectives.BASE_LATENCY_US["ring"], collectives.HW_LATENCY_US, collectives.PROTOCOL_SHARE
    cap = collectives.LL_MAX_BUSBW_GBS
    lines = ["NCCL's ring latency in us (NCCL 2.30.7 src/graph/tuning.cc, as gpumem.timing.collectives "
             "holds it)", f"{'protocol':9s}{'base a0':>9s}{'a, a step on NVLink':>22s}{'a_net, across nodes':>22s}"
             f"{'bandwidth':>12s}"]
    for p in ("simple", "LL"):
        lines.append(f"{PROTOCOL[p]:9s}{base[p]:>9.1f}{hw['nvlink']['ring'][p]:>22.1f}"
                     f"{hw['net']['ring'][p]:>22.1f}{share[('ring', p)]:>11.0%}")
    lines.append(textwrap.fill(
        f"LL's bus bandwidth is also capped: {cap['hopper']:g} GB/s in one Hopper node, "
        f"{cap['intel'][1]:g} GB/s across more than two nodes (Intel hosts). NCCL takes whichever "
        "protocol is faster for the size.", 100))
    return "\n".join(lines)


def latency_parts(t: collectives.CollectiveTime) -> tuple[float, int, float, int, float]:
    """``t``'s ring latency as NCCL sums it: (a0, steps inside a node, a, steps across nodes,
    a_net), in us. Two details of NCCL's model: in a multi-node ring a step inside a node costs at
    least the host's network overhead (x3 for Simple), and a ring of one rank per node pays the
    tree's network step (``collectives.ring_latency_us``)."""
    g, p = t.group, t.protocol
    steps, inter = g.size - 1, g.nodes - 1
    a = collectives.HW_LATENCY_US["nvlink" if g.node.nvlink else "pcie"]["ring"][p]
    if g.nodes > 1:
        a = max(a, collectives.NET_OVERHEAD_US[g.node.cpu_vendor] * (3 if p == "simple" else 1))
    a_net = collectives.HW_LATENCY_US["net"]["tree" if g.ranks_per_node == 1 else "ring"][p]
    return collectives.BASE_LATENCY_US["ring"][p], steps - inter, a, inter, a_net


def alpha_beta_table(node_name: str = "dgx-h100", small: float = 1e6) -> str:
    """The all-gather of the 70B model's bf16 weights (and of ``small`` bytes, where latency
    rules) on each group shape: the binding link, time, latency part, bus bandwidth, protocol;
    then each latency as NCCL's sum (:func:`latency_parts`)."""
    node, big = hardware.node(node_name), gather_bytes()
    rows = list(zip(gather_times(node_name), gather_times(node_name, small)))
    head_big, head_small = f"S = {big / 1e9:.1f} GB", f"S = {small / 1e6:g} MB"
    protocols = "/".join(sorted({PROTOCOL[t.protocol] for (_, t), _ in rows}))
    lines = [f"all-gather on {node.label} nodes: {head_big} ({label(GATHER_MODEL)}'s bf16 weights) "
             f"and {head_small}", f"{'':36s}{head_big + ', ' + protocols:^37s} {head_small:^25s}".rstrip(),
             f"{'group':36s}{'binds':>8s}{'time':>11s}{'latency':>8s}{'busbw':>10s} "
             f"{'time':>7s}{'latency':>8s}  protocol"]
    for (name, t), (_, s) in rows:
        lines.append(f"{name:36s}{t.binding:>8s}{t.seconds * 1e3:>8,.1f} ms{t.latency_s * 1e6:>5.0f} us"
                     f"{t.busbw / 1e9:>5.0f} GB/s {s.seconds * 1e6:>4.0f} us{s.latency_s / s.seconds:>8.0%}"
                     f"  {PROTOCOL[s.protocol]}")
    lines += ["latency = a0 + (steps inside a node) x a + (steps across nodes) x a_net, in us:",
              f"  {'group':24s}{'S':>10s}  {'protocol':9s}{'a0':>5s}{'inside x a':>13s}"
              f"{'across x a_net':>17s}{'latency':>10s}"]
    for (name, t), (_, s) in rows:
        for i, (c, size) in enumerate(((t, head_big[4:]), (s, head_small[4:]))):
            a0, n_in, a, n_x, a_net = latency_parts(c)
            lines.append(f"  {name.split(':')[0] if i == 0 else '':24s}{size:>10s}  {PROTOCOL[c.protocol]:9s}"
                         f"{a0:>5.1f}{f'{n_in} x {a:.1f}':>13s}{f'{n_x} x {a_net:.1f}':>17s}"
                         f"{c.latency_s * 1e6:>10.1f}")
    return "\n".join(lines)


def alpha_beta_sentence(node_name: str = "dgx-h100") -> str:
    """The comparison the prose draws, printed from the same numbers: the three times, then the
    two link terms of the 64-GPU group (its NICs carry one rank's share; NVLink (r-1)/r of it)."""
    (_, one), (_, spread), (_, full) = gather_times(node_name)
    g, links = full.group, dict(full.links)
    r, n, nics = g.ranks_per_node, g.size, g.node.nics_for(g.ranks_per_node)
    nic = g.node.nic_bw * collectives.NETWORK_EFFICIENCY / 1e9
    nvl = g.node.nvlink * collectives.NVLINK_EFFICIENCY / 1e9
    return textwrap.fill(
        f"One node: {one.seconds:.2f} s; eight full nodes: {full.seconds:.2f} s; the same eight ranks "
        f"one per node: {spread.seconds:.2f} s, {spread.seconds / one.seconds:.1f}x one node's. "
        f"On the {n} GPUs the network term is {n - 1}/{n} S / ({nics} NICs x {nic:.0f} GB/s) = "
        f"{links['network'] * 1e3:.0f} ms and the NVLink term {r - 1}/{r} x {n - 1}/{n} S / {nvl:.0f} GB/s "
        f"= {links['NVLink'] * 1e3:.0f} ms: the network binds, NVLink's term "
        f"{1 - links['NVLink'] / links['network']:.0%} shorter.", 100)


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
    """Bubble, first stage's micro-batches in flight and p2p volume of each schedule. The bubble
    is a share of the micro-batches' own compute; of the whole step it is bubble / (1 + bubble)."""
    msg = p2p_bytes()
    lines = [f"p = {p} stages; per micro-batch and stage F = 1, B = 2 (zero-bubble schedules split B into",
             "input gradient 1 + weight gradient W = 1);",
             f"p2p message {msg / 1e6:.1f} MB ({label(GATHER_MODEL)}, tp = 8, sequence parallel, "
             "4,096 tokens)",
             f"{'schedule':18s} {'v':>2s} {'m':>3s} {'bubble':>9s} {'first stage':>12s} "
             f"{'p2p sends':>10s} {'p2p MB':>8s}",
             f"{'':18s} {'':>2s} {'':>3s} {'/compute':>9s} {'holds (mb)':>12s} "
             f"{'per step':>10s} {'per step':>8s}"]
    notes = []
    for name, v, m, r in schedule_rows(p, ms):
        if isinstance(r, str):
            lines.append(f"{name:18s} {v:>2d} {m:>3d}  refused: {r.split(' (')[0]}")
            continue
        lines.append(f"{name:18s} {v:>2d} {m:>3d} {r.bubble_fraction:>9.1%} "
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
    (:data:`TEN_GBE`, an assumption). Labels say it in words: '<ports> per node (<why>)'."""
    dgx = placement.node_for(gpus.get(SLOW_GPU))
    one_port = [(hardware.node("g2-l4x8").nic_bw, "a Google Cloud G2 node's NIC rate"),
                (zero_layouts.ETHERNET_25G.nic_bw, "chapters 02 and 07's cluster"),
                (TEN_GBE, "assumption: a common office port")]
    own = " ".join(dgx.label.split()[:2])
    out = [(f"{dgx.nics} x {dgx.nic_bw * 8 / 1e9:.0f} Gb/s {dgx.fabric} per node ({own}'s own)", dgx)]
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


HEADS = {"zero3": "ZeRO-3", "hpz": "hpZ", "mics": "MiCS/HSDP", "zero1": "ZeRO-1"}


def slow_network_table() -> str:
    """The planner's best layout per network, then each sharding layout's exposed communication."""
    nets = networks()
    lines = [f"{label(SLOW_MODEL)} on {SLOW_GPUS} x A100 40GB in 2 nodes, {SLOW_BATCH} sequences of "
             f"{SLOW_SEQ:,} a step, data parallelism only", "the planner's best layout per network:"]
    for name, node in nets:
        b = slow_plan(node).best
        lines += [f"  {name}: {b.time['total']:.2f} s/step", f"      ZeRO traffic "
                  f"{b.time['data_parallel_moved_s']:.2f} s, {b.time['data_parallel']:.2f} s of it exposed",
                  f"      {b.layout.label()}"]
    micro = SLOW_BATCH // SLOW_GPUS
    first = slow_layouts(nets[0][1])
    lines += [textwrap.fill(
        f"exposed ZeRO traffic per step, s, of the four sharding layouts (each GPU: {micro} micro-batches "
        f"of one {SLOW_SEQ:,}-token sequence, no checkpointing, no offload; compute "
        f"{first['zero3']['compute_s']:.2f} s a step):", 100),
        f"  {'network':38s}" + "".join(f"{h:>11s}" for h in HEADS.values())]
    for name, node in nets:
        r = slow_layouts(node)
        lines.append(f"  {name.split(' (')[0]:38s}" + "".join(f"{r[k]['exposed_s']:>11.2f}" for k in HEADS))
    lines.append(f"  {'model states per GPU, GB':38s}" + "".join(
        f"{first[k]['states_bytes'] / 1e9:>11.1f}" for k in HEADS))
    return "\n".join(lines)


OFFLOADED = {"optimizer": "the optimizer states", "optimizer+params": "the optimizer states and the parameters"}


def offload_reason() -> str:
    """Offload or re-run on the fastest network, from the planner's own numbers: the best plan that
    offloads frees the GPU memory that lets every layer keep its activations, but pays CPU Adam
    (the node's published rate shared by its eight ranks) after backward; the best plan that keeps
    its states on the GPU re-runs layers to fit. Whichever is faster is the top plan."""
    name, node = networks()[0]
    r = slow_plan(node)
    top = r.best
    moved = min((p for p in r.plans if p.layout.offload != "none"), key=lambda p: p.time["total"])
    kept = min((p for p in r.plans if p.layout.offload == "none"), key=lambda p: p.time["total"])
    winner = "offloads" if top.layout.offload != "none" else "keeps its states on the GPU"
    return textwrap.fill(
        f"{name.split(' (')[0]}: the top plan {winner}. The fastest plan that offloads "
        f"{OFFLOADED[moved.layout.offload]} to host memory "
        f"{'checkpoints no layer' if moved.layout.checkpoint == 'none' else 'checkpoints ' + moved.layout.checkpoint}"
        f": compute {moved.time['compute']:.2f} s, offload {moved.time['offload']:.2f} s exposed (CPU Adam "
        f"{moved.time['offload_terms']['cpu_adam']:.2f} s of it), {moved.time['total']:.2f} s a step. The fastest "
        f"plan that keeps its states on the GPU must checkpoint ({kept.layout.checkpoint}) to fit: compute "
        f"{kept.time['compute']:.2f} s with the re-runs, {kept.time['total']:.2f} s a step.", 100)


def pricing_note(net: int = 1) -> str:
    """How the two tables of :func:`slow_network_table` price a step differently, from their own
    numbers on network ``net`` of :func:`networks`: the planner's best plan against the sharding
    table's ZeRO-3 (6 x psi FLOPs a token, its share of peak read back from its seconds)."""
    name, node = networks()[net]
    best, row = slow_plan(node).best, slow_layouts(node)["zero3"]
    tokens = row["micro_batches"] * row["tokens_per_gpu"]
    share = compute.train_flops(models.get(SLOW_MODEL).n_params(), tokens) / (
        row["compute_s"] * gpus.get(SLOW_GPU).bf16_flops)
    lay, t = best.layout, best.time
    return textwrap.fill(
        f"The two tables price a step differently. On {name.split(' (')[0]} the planner's best runs "
        f"{lay.n_micro} micro-batch{'es' if lay.n_micro > 1 else ''} of {lay.micro_batch} sequence"
        f"{'s' if lay.micro_batch > 1 else ''} with checkpoint {lay.checkpoint} (attention's FLOPs and "
        f"the re-runs counted): compute {t['compute']:.2f} s, ZeRO traffic {t['data_parallel_moved_s']:.2f} s, "
        f"{t['data_parallel']:.2f} s exposed. The sharding table runs ZeRO-3 at {row['micro_batches']} "
        f"micro-batches of one sequence, no checkpointing, 6 x psi FLOPs a token at {share:.0%} of peak: "
        f"compute {row['compute_s']:.2f} s, ZeRO traffic {row['comm_s']:.2f} s, {row['exposed_s']:.2f} s exposed.",
        100)
