"""Chapter 06's questions that need the topology: which link binds a collective for a group
shape drawn per attempt, and how long the collective takes. Expected values are
:func:`gpumem.timing.collectives.collective_time` on the drawn placement; the prompt states every
figure a learner needs (link rates, the share NCCL reaches, where the group's ranks sit)."""

from gpumem.course.quiz import Numeric
from gpumem.course.quiz_draws import label, pick
from gpumem.memory import models
from gpumem.timing import collectives, hardware, zero_layouts

GB = 10**9
NODE_TYPES = {n.name: n for n in (hardware.node("dgx-a100"), hardware.node("dgx-h100"),
                                  hardware.node("g2-l4x8"), zero_layouts.ETHERNET_25G)}
NODE_WORDS = {zero_layouts.ETHERNET_25G.name: "8x H100 SXM nodes with one 25 Gb/s Ethernet port each"}
# (ranks, ranks per node): one node, whole nodes, and part-filled nodes; N <= 64
SHAPES = ((8, 8), (4, 4), (16, 8), (16, 4), (16, 2), (16, 1), (32, 8), (32, 4), (32, 2), (64, 8))


def _link_words(node: hardware.NodeType) -> dict:
    """How the prompt states a node's links, and the rates the answer uses (bytes/s)."""
    if node.nvlink:
        intra, eff = node.nvlink, collectives.NVLINK_EFFICIENCY
        words = (f"NVLink between its GPUs at {intra / GB:.0f} GB/s per GPU per direction, of which "
                 f"NCCL reaches {eff:.0%} ({intra * eff / GB:.1f} GB/s)")
        name = "NVLink"
    else:
        intra, eff = node.pcie, collectives.PCIE_EFFICIENCY
        words = (f"no NVLink: every send leaves a GPU over its PCIe link ({intra / GB:.1f} GB/s per "
                 f"direction, of which NCCL reaches {eff:.0%}, {intra * eff / GB:.1f} GB/s), to a peer "
                 "or to the NIC")
        name = "PCIe"
    nic = (f"{node.nics} NICs per node, one beside each GPU (a rank uses the one beside it)"
           if node.nics == node.gpus_per_node else "one NIC per node, shared by its GPUs")
    return {"intra_words": words, "intra_name": name, "intra_eff_bw": intra * eff,
            "nic_words": f"{nic}, {node.nic_bw * 8 / GB:.0f} Gb/s = {node.nic_bw / GB:g} GB/s each per "
                         f"direction, of which NCCL reaches {collectives.NETWORK_EFFICIENCY:.0%} "
                         f"({node.nic_bw * collectives.NETWORK_EFFICIENCY / GB:g} GB/s)",
            "nic_eff_bw": node.nic_bw * collectives.NETWORK_EFFICIENCY,
            "nic_eff_bw_gb": node.nic_bw * collectives.NETWORK_EFFICIENCY / GB}


def _placed(n: dict) -> hardware.Group:
    return hardware.Group(NODE_TYPES[n["node_name"]], n["per_node"], n["nodes"])


def _gather(rng) -> dict:
    node = NODE_TYPES[pick(rng, tuple(NODE_TYPES))]
    ranks, per_node = pick(rng, SHAPES)
    model = pick(rng, ("llama-3-8b", "llama-3-70b"))
    s = 2 * models.get(model).n_params()
    n = {"node_name": node.name, "node": NODE_WORDS.get(node.name, f"{node.label} nodes"), "ranks": ranks, "per_node": per_node,
         "nodes": ranks // per_node, "model": label(model), "s_gb": s / GB, "s_bytes": s,
         "gpus_per_node": node.gpus_per_node, "nics": node.nics} | _link_words(node)
    n["where"] = ("all in one node" if n["nodes"] == 1 else
                  f"{per_node} per node on {n['nodes']} nodes")
    t = collectives.collective_time("all_gather", s, _placed(n))
    v = (ranks - 1) / ranks * s                           # bytes each rank sends
    m = node.nics_for(per_node) if n["nodes"] > 1 else 0
    n |= {"binding": t.binding, "v_gb": v / GB, "nics_used": m,
          "own_nic_ms": v / n["nic_eff_bw"] * 1e3 if node.nics else float("nan"),
          "intra_ms": v / n["intra_eff_bw"] * 1e3,
          "every_nic_ms": v / (node.nics * n["nic_eff_bw"]) * 1e3 if node.nics else float("nan")}
    return n


def _gather_ms(n: dict) -> float:
    return collectives.collective_time("all_gather", n["s_bytes"], _placed(n)).seconds * 1e3


def _gather_explained(n: dict) -> str:
    v = f"Each rank sends (N-1)/N x S = {n['v_gb']:.2f} GB"
    if n["nodes"] == 1:
        return (f"{v}, every byte over {n['intra_name']} ({n['intra_eff_bw'] / GB:.1f} GB/s reached): "
                f"{n['answer']} ms. No NIC is involved in a one-node group.")
    over = (f"spread over the {n['nics_used']} NICs beside the group's ranks" if n["nics_used"] > 1
            else "through the one NIC its ranks reach")
    nic = (f"the ring leaves each node once, so the node's NICs together carry one rank's "
           f"{n['v_gb']:.2f} GB, {over}: {n['v_gb'] * GB / (n['nics_used'] * n['nic_eff_bw']) * 1e3:,.1f} ms")
    if n["intra_name"] == "PCIe":
        intra = f"every send also crosses PCIe: {n['intra_ms']:,.1f} ms"
    elif n["per_node"] > 1:
        share = (n["per_node"] - 1) / n["per_node"]
        intra = f"inside a node (k-1)/k of the hops are NVLink: {share * n['intra_ms']:,.1f} ms"
    else:
        intra = "with one rank per node no hop is NVLink"
    return (f"{v}. Network: {nic}; {intra}. The slower link binds ({n['binding']}): {n['answer']} ms. "
            "A ring crosses each node once: what counts is the NICs its ranks on a node reach together, "
            "not one NIC per rank.")


def _fsdp(rng) -> dict:
    node = hardware.node(pick(rng, ("dgx-a100", "dgx-h100", "hgx-h200")))
    model = pick(rng, ("llama-3-70b", "llama-3.1-405b"))
    tp = pick(rng, (1, 2, 4, 8))
    nodes = pick(rng, (4, 8, 16)) if model == "llama-3-70b" else 16     # 405B: 16 B x psi / 128 GPUs
    dp, per_node = nodes * node.gpus_per_node // tp, node.gpus_per_node // tp
    cfg = models.get(model)
    s = 2 * cfg.n_params() // tp
    n = {"node_name": node.name, "node": node.label, "model": label(model), "n_params": cfg.n_params(),
         "tp": tp, "dp": dp, "nodes": nodes, "gpus": tp * dp, "per_node": per_node, "s_bytes": s,
         "s_gb": s / GB, "gpus_per_node": node.gpus_per_node} | _link_words(node)
    v = (dp - 1) / dp * s
    return n | {"v_gb": v / GB, "one_nic_ms": v / n["nic_eff_bw"] * 1e3,
                "all_nics_ms": v / (node.nics * n["nic_eff_bw"]) * 1e3}


def _fsdp_ms(n: dict) -> float:
    group = hardware.Group(hardware.node(n["node_name"]), n["per_node"], n["nodes"])
    return collectives.collective_time("reduce_scatter", n["s_bytes"], group).seconds * 1e3


def _fsdp_explained(n: dict) -> str:
    k = n["per_node"]
    text = (f"The FSDP group strides by tp = {n['tp']}: {k} of its ranks per node, so its ring crosses "
            f"each node through the {k} NIC{'s' if k > 1 else ''} beside them. Each rank sends (N-1)/N x S "
            f"= {n['v_gb']:,.2f} GB; over {k} x {n['nic_eff_bw_gb']:g} GB/s that is {n['answer']} ms (the "
            "NICs bind: NVLink carries the in-node hops faster). ")
    if k == n["gpus_per_node"]:
        return text + "With tp = 1 the group fills each node and all its NICs carry the ring."
    return text + (f"One NIC per node would take {n['one_nic_ms']:,.0f} ms. The {n['tp']} FSDP groups (one "
                   "per tensor-parallel rank) run at once, each on its own NICs.")


QUESTIONS = [
    Numeric("gather-placed",
            "A ZeRO-3 group of {ranks} GPUs sits {where}, on {node} ({gpus_per_node} GPUs a node): "
            "{intra_words}; {nic_words}. It all-gathers {model}'s bf16 weights, S = {s_gb:.2f} GB "
            "(every rank ends with all of S), with NCCL's ring. Which link binds? Answer with the "
            "all-gather's time in milliseconds (NCCL's latency is under 1 % here: count bandwidth only).",
            answer=_gather_ms, unit="ms", rel_tol=0.02, draw=_gather,
            hint="Each rank sends (N-1)/N x S. Inside a node the ring's hops are NVLink (on a PCIe box, "
                 "every send crosses PCIe). Between nodes a ring leaves each node once: the node's NICs "
                 "together carry one rank's (N-1)/N x S, over the NICs beside the group's ranks. Time "
                 "each link; the slower binds.",
            explanation=_gather_explained,
            traps=((lambda n: n["own_nic_ms"], "that sends each rank's whole share through one NIC of its "
                                               "own; a ring crosses each node once, so the node's NICs "
                                               "together carry one rank's share."),
                   (lambda n: n["intra_ms"] if n["nodes"] > 1 else float("nan"),
                    "that is the in-node link; between nodes the ring also crosses the NICs, and they are "
                    "slower here."),
                   (lambda n: n["every_nic_ms"] if 1 < n["nodes"] and n["nics_used"] < n["nics"]
                    else float("nan"),
                    "only the NICs beside the group's ranks carry its ring, {nics_used} per node here, "
                    "not all of the node's."))),
    Numeric("fsdp-reduce-scatter",
            "{model} ({n_params:,} parameters, psi) trains with FSDP2 over {dp} ranks and tensor "
            "parallelism {tp} on {gpus} GPUs, {nodes} {node} nodes: {intra_words}; {nic_words}. Ranks "
            "are numbered tensor-parallel first, as Megatron and torchtitan do (rank = tp_rank + {tp} x "
            "dp_rank), {gpus_per_node} to a node. Each micro-batch every FSDP group reduce-scatters the "
            "bf16 gradients of its tensor-parallel shard, S = 2 B x psi / {tp} = {s_gb:.2f} GB, with "
            "NCCL's ring. How many milliseconds does one reduce-scatter take? (Latency is under 1 % here.)",
            answer=_fsdp_ms, unit="ms", rel_tol=0.02, draw=_fsdp,
            hint="How many ranks of one FSDP group share a node, and which NICs sit beside them? A ring "
                 "reduce-scatter sends (N-1)/N x S per rank; between nodes the NICs beside the group's "
                 "ranks on a node carry one rank's share together.",
            explanation=_fsdp_explained,
            traps=((lambda n: n["one_nic_ms"], "the group has {per_node} ranks on each node, each beside its "
                                               "own NIC: the node's crossing is spread over {per_node} NICs."),
                   (lambda n: n["all_nics_ms"], "only the NICs beside this group's ranks carry its ring: "
                                                "{per_node} per node, not {gpus_per_node}."),
                   (lambda n: 2 * n["expected"], "that is an all-reduce's 2 (N-1)/N x S; a reduce-scatter "
                                                 "sends (N-1)/N x S.")),
            ),
]
