"""Chapter 06's topology drawing: nodes with their NVLink switch and NICs, a layout's groups on
them, and the links each group's collective crosses. Every figure is read from the time engine
(:mod:`gpumem.timing.hardware`, :mod:`gpumem.timing.collectives`); none is typed here.

Rank order: tensor-parallel ranks fastest, then context-parallel, data-parallel, pipeline
(Megatron-LM ``megatron/core/parallel_state.py``, ``initialize_model_parallel``'s default
``order="tp-cp-ep-dp-pp"``, no experts here); global ranks node-major, as
:class:`gpumem.timing.hardware.Cluster` numbers them.
"""

import textwrap
from string import ascii_lowercase

from gpumem.course.quiz_draws import label
from gpumem.memory import models
from gpumem.timing import collectives, hardware

ORDER = ("tp", "cp", "dp", "pp")
NAMES = {"tp": "tensor-parallel", "cp": "context-parallel", "dp": "data-parallel", "pp": "pipeline"}
CELL = 5                         # characters per GPU column
SEQ, MICRO = 4096, 1             # the sequence and micro-batch the messages below are sized for


def coords(rank: int, dims: dict) -> dict:
    """A global rank's index on each axis (tp fastest, then cp, dp, pp)."""
    out = {}
    for axis in ORDER:
        size = dims.get(axis, 1)
        out[axis], rank = rank % size, rank // size
    return out


def group_ids(dims: dict, axis: str) -> list[int]:
    """For each global rank, which group of ``axis`` it belongs to (numbered by first rank); the
    ``dp`` group is the gradient group, dp x cp ranks (context-parallel ranks hold the same
    weights: Megatron reduces gradients over the data-and-context-parallel group)."""
    gpus = 1
    for a in ORDER:
        gpus *= dims.get(a, 1)
    seen: dict[tuple, int] = {}
    out = []
    for r in range(gpus):
        c = coords(r, dims)
        key = tuple(c[a] for a in ORDER if a != axis and not (axis == "dp" and a == "cp"))
        out.append(seen.setdefault(key, len(seen)))
    return out


def groups(cluster: hardware.Cluster, dims: dict) -> dict:
    """Rank 0's group on each axis of size > 1, placed on ``cluster``; ``dp``: the gradient
    group of dp x cp ranks, stride tp (see :func:`group_ids`)."""
    out, stride = {}, 1
    for axis in ORDER:
        size = dims.get(axis, 1)
        if size > 1:
            wide = axis == "dp" and dims.get("cp", 1) > 1
            out[axis] = cluster.group(size * dims["cp"], dims.get("tp", 1)) if wide else cluster.group(size, stride)
        stride *= size
    return out


def nics_used(group: hardware.Group, first_local: list[int]) -> list[int]:
    """Indices of the NICs a cross-node group's ranks sit beside on each node (NICs spread evenly
    over the node's GPUs, as :meth:`hardware.NodeType.nics_for` counts them)."""
    node = group.node
    return sorted({g * node.nics // node.gpus_per_node for g in first_local})


def _cells(cells) -> str:
    """GPU columns: each value right-aligned in :data:`CELL` - 1 characters, then a space."""
    return "".join(str(c).rjust(CELL - 1) + " " for c in cells)


def hardware_lines(node: hardware.NodeType, nodes: int = 2) -> list[str]:
    """The nodes as boxes: GPUs, their NVLink switch (or PCIe), NICs, and the fabric below."""
    per = node.gpus_per_node
    nic_at = [i * per // node.nics for i in range(node.nics)]      # the GPU each NIC sits beside
    switch = "NVSwitch (NVLink)" if node.nvlink else "PCIe switches"
    inner = 4 + per * CELL

    def box(label, cells):
        return "|" + label.ljust(4) + _cells(cells) + "|"

    boxes = []
    for n in range(nodes):
        wire = box("", ["|"] * per)
        nic_wire = ["|" if i in nic_at else "" for i in range(per)]
        boxes.append([
            "+" + f" node {n} ".center(inner, "-") + "+",
            box("GPU", [n * per + i for i in range(per)]), wire,
            "|" + " " * 4 + ("[" + f" {switch} ".center(per * CELL - 3, "=") + "]").ljust(per * CELL) + "|",
            wire,
            box("NIC", [nic_at.index(i) if i in nic_at else "" for i in range(per)]),
            box("", nic_wire),
            "+" + "-" * 4 + _cells(nic_wire).replace(" ", "-") + "+",
            " " + " " * 4 + _cells(nic_wire) + " "])
    lines = ["  ".join(parts).rstrip() for parts in zip(*boxes)]
    width = max(len(line) for line in lines)
    fabric = f" {node.fabric} fabric " if node.nics else " no network "
    lines.append(fabric.center(width, "="))
    return lines


def legend(node: hardware.NodeType) -> list[str]:
    """Each link's rate per direction, what NCCL reaches on it, and where the figure comes from."""
    src = node.sources
    out = []
    if node.nvlink:
        out.append(f"NVLink: {node.nvlink / 1e9:.0f} GB/s per GPU per direction ({node.gpu.label}, "
                   f"gpumem.memory.gpus); NCCL reaches x{collectives.NVLINK_EFFICIENCY:.3f}")
        key = "gpus_per_node, nvlink_domain"
        if key in src:
            out.append(f"  source [{key}]: {src[key]}")
        if node.nvls_busbw:
            out.append(f"NVLS (NVLink SHARP: the NVSwitch adds the shards) all-reduce over a full node: "
                       f"{node.nvls_busbw / 1e9:.0f} GB/s busbw")
            if "nvls_busbw" in src:
                out.append(f"  source [nvls_busbw]: {src['nvls_busbw']}")
    else:
        out.append(f"PCIe Gen{node.pcie_gen}: {node.pcie / 1e9:.1f} GB/s per GPU per direction; "
                   f"NCCL reaches x{collectives.PCIE_EFFICIENCY:.3f} (assumption)")
    if node.nics:
        out.append(f"NIC: {node.nics} per node, {node.nic_bw / 1e9:g} GB/s each per direction "
                   f"({node.nic_bw * 8 / 1e9:.0f} Gb/s {node.fabric}); NCCL reaches "
                   f"x{collectives.NETWORK_EFFICIENCY:.2f}")
        key = "nics, nic_bw"
        if key in src:
            out.append(f"  source [{key}]: {src[key]}")
    return [w for line in out for w in textwrap.wrap(line, 100, subsequent_indent="      ")]


def messages(cfg, dims: dict) -> dict:
    """Bytes S of each axis's collective for ``cfg`` in bf16 at :data:`SEQ` tokens, micro-batch 1,
    with the arithmetic in words: tp: one all-reduce of a layer's output (s/cp tokens x h x 2 B;
    4 a layer without sequence parallelism: 2 forward, 2 backward); cp: one ring step's K and V
    chunk (s/cp tokens x kv heads per tp rank x head_dim x 2 (K, V) x 2 B, a send/recv); dp: the
    all-reduce of the gradients of one tensor-parallel shard (2 B x psi / tp, once a step)."""
    tp, cp = dims.get("tp", 1), dims.get("cp", 1)
    local, kv = SEQ // cp * MICRO, cfg.n_kv_heads // tp
    return {"tp": ("all_reduce", 2 * local * cfg.d_model,
                   f"a layer's output, {local:,} tokens x {cfg.d_model:,} x 2 B; "
                   "4 a layer: 2 forward, 2 backward"),
            "cp": ("send_recv", 2 * 2 * local * kv * cfg.head_dim,
                   f"a K and V chunk, {local:,} tokens x {kv} kv heads x {cfg.head_dim} x 2 (K, V) x 2 B; "
                   "each ring step"),
            "dp": ("all_reduce", 2 * cfg.n_params() // tp,
                   f"a tp shard's gradients, 2 B x psi/{tp} (psi {cfg.n_params() / 1e9:.1f}e9), once a step"
                   + (f", dp x cp = {dims['dp'] * cp} ranks" if cp > 1 else ""))}


def size(nbytes: float) -> str:
    """Bytes as MB below a GB, else GB (10^6, 10^9)."""
    return f"{nbytes / 1e6:,.1f} MB" if nbytes < 1e9 else f"{nbytes / 1e9:,.1f} GB"


def crossing(group: hardware.Group, ranks: list[int]) -> str:
    """The links a group's traffic crosses, in words."""
    node = group.node
    inside = "NVLink (NVSwitch)" if node.nvlink and group.ranks_per_node > 1 else (
        "PCIe" if group.ranks_per_node > 1 else "")
    if group.nodes == 1:
        return inside
    local = sorted({r % node.gpus_per_node for r in ranks})
    nics = nics_used(group, local)
    across = f"NIC{'s' if len(nics) > 1 else ''} {','.join(map(str, nics))} of each node"
    return f"{inside} + {across}" if inside else across


def layout_lines(node: hardware.NodeType, dims: dict, model: str = "llama-3-70b",
                 nodes: int = 2) -> list[str]:
    """One layout on ``nodes`` nodes: each GPU's group letter per axis, then each axis's
    collective: the links it crosses, its time from :func:`collectives.collective_time`, the
    link that binds."""
    cluster, cfg = hardware.Cluster(node, nodes), models.get(model)
    per = node.gpus_per_node
    shown = [a for a in ORDER if dims.get(a, 1) > 1]
    lines = [" x ".join(f"{a}={dims[a]}" for a in shown) + f" on {nodes} nodes:"]
    for axis in shown:
        cells = [ascii_lowercase[i % 26] for i in group_ids(dims, axis)]
        lines.append("  ".join((axis.ljust(5) if n == 0 else " " * 5) + _cells(cells[n * per:(n + 1) * per])
                               for n in range(nodes)).rstrip())
    msgs, placed = messages(cfg, dims), groups(cluster, dims)
    for axis in shown:
        coll, nbytes, what = msgs[axis]
        group = placed[axis]
        ranks = [r for r, g in enumerate(group_ids(dims, axis)) if g == 0]
        if coll == "send_recv":                       # one ring step: a rank and its neighbour
            group = cluster.group(2, ranks[1] - ranks[0])
        t = collectives.collective_time(coll, nbytes, group)
        algo = "p2p" if coll == "send_recv" else t.algorithm
        lines.append(f"  {axis} {coll.replace('_', '-')} (group a: {group.ranks_per_node} per node x "
                     f"{group.nodes} node{'s' if group.nodes > 1 else ''}) crosses {crossing(group, ranks)}")
        lines.append(f"      S = {size(nbytes)}: {what}")
        lines.append(f"      {t.seconds * 1e3:,.2f} ms, {algo}, bound by {t.binding}")
    return lines


LAYOUTS = ({"tp": 8, "dp": 2}, {"tp": 4, "cp": 2, "dp": 2})


def drawing(node_name: str = "dgx-h100", layouts=LAYOUTS, model: str = "llama-3-70b") -> str:
    """Two nodes of ``node_name``, the links' figures with their sources, and each layout's groups
    and collectives (letters: which group of that axis a GPU belongs to)."""
    node = hardware.node(node_name)
    out = [f"Two {node.label} nodes (gpumem.timing.hardware node type {node.name!r}), ranks node-major",
           *hardware_lines(node, 2), *legend(node), "",
           f"{label(model)}, sequence {SEQ:,}, micro-batch {MICRO}, bf16; letters: the GPU's group "
           "on that axis"]
    for dims in layouts:
        out += layout_lines(node, dims, model)
    return "\n".join(out)
