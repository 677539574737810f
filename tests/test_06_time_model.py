"""Chapter 06's time model (section 4, section 7 and the quiz's topology questions) against hand
derivations: ring collectives timed on the link that binds, with the hardware and the share of
line rate NCCL reaches typed here from their sources, never read from the engine.

Hand model (latency aside): a ring all-gather or reduce-scatter of S over n ranks sends
(n-1)/n x S per rank, an all-reduce twice that. Inside one node every byte crosses NVLink (PCIe on
a box without NVLink). Over several nodes with k ranks on each, a ring leaves each node once, so
the NICs beside the k ranks carry one rank's share together, and (k-1)/k of a rank's share stays
on NVLink (all of it crosses PCIe on a PCIe box). The slower link binds. The engine adds NCCL's
latency, under 1 % for every size these checks use: the tolerance is 1.2 % and the engine's time
is never below the hand bandwidth time.
"""

import re

import nbformat
import pytest

from conftest import ROOT

GB = 10**9
# per direction (NVIDIA's datasheets quote both directions summed: A100 600, H100/H200 900 GB/s)
NVLINK = {"A100": 300e9, "H100": 450e9, "H200": 450e9}
PCIE_GEN4 = 31.5e9                 # x16, per direction, after 128b/130b encoding (L4 datasheet: Gen4)
NVLINK_REACHED = 370 / 450         # nccl-tests #212, S. Jeaugey: 370 GB/s effective of 450 on H100
PCIE_REACHED = 370 / 450           # the engine's stated assumption: NVLink's share
NIC_REACHED = 47 / 50              # nccl-tests #290: "46-48GB/s per NIC" for NDR 400 Gb/s
# node as the prompt names it -> (GPU family or None for PCIe-only, NICs per node, Gb/s per NIC)
NODES = {"DGX A100": ("A100", 8, 200), "DGX H100": ("H100", 8, 400), "HGX/DGX H200": ("H200", 8, 400),
         "g2-standard-96": (None, 1, 100), "one 25 Gb/s Ethernet port": ("H100", 1, 25)}
# Meta's configs: layers, d_model, kv heads (head dim 128), FFN, vocab
LLAMA = {"Llama-3-8B": (32, 4096, 8, 14_336, 128_256), "Llama-3-70B": (80, 8192, 8, 28_672, 128_256),
         "Llama-3.1-405B": (126, 16_384, 8, 53_248, 128_256)}
SEEDS = range(80)


def params(model: str) -> int:
    layers, d, kv_heads, ffn, vocab = LLAMA[model]
    kv = kv_heads * 128
    return 2 * vocab * d + layers * (2 * d * d + 2 * d * kv + 3 * d * ffn + 2 * d) + d


def node_of(prompt: str) -> tuple:
    return next(v for k, v in NODES.items() if k in prompt)


def model_of(prompt: str) -> str:
    return next(m for m in sorted(LLAMA, key=len, reverse=True) if m in prompt)


def links(volume: float, per_node: int, nodes: int, node: tuple) -> dict:
    """Seconds per link, by the hand model of the module docstring."""
    gpu, nics, gbps = node
    intra_name = "NVLink" if gpu else "PCIe"
    intra = NVLINK[gpu] * NVLINK_REACHED if gpu else PCIE_GEN4 * PCIE_REACHED
    if nodes == 1:
        return {intra_name: volume / intra}
    used = min(nics, per_node) if nics == 8 else 1       # one NIC per GPU, or one per node
    out = {"network": volume / (used * gbps / 8 * GB * NIC_REACHED)}
    inside = volume if gpu is None else (per_node - 1) / per_node * volume
    if inside:
        out[intra_name] = inside / intra
    return out


def seeded(quiz, qid):
    for seed in SEEDS:
        quiz.seed(seed)
        yield quiz._get(qid)


@pytest.fixture
def quiz():
    from gpumem.chapters.ch06_combining_strategies import quiz as q
    return q.QUIZ


# -- the quiz's topology questions ---------------------------------------------------------------

def gather_case(q) -> tuple[float, str, dict, int]:
    prompt = q.prompt_text()
    ranks = int(re.search(r"group of (\d+) GPUs", prompt).group(1))
    if "all in one node" in prompt:
        per_node, nodes = ranks, 1
    else:
        per_node, nodes = map(int, re.search(r"sits (\d+) per node on (\d+) nodes", prompt).groups())
    s = 2 * params(model_of(prompt))
    assert f"S = {s / GB:.2f} GB" in prompt
    t = links((ranks - 1) / ranks * s, per_node, nodes, node_of(prompt))
    link = max(t, key=t.get)
    return t[link] * 1e3, link, t, nodes


def test_gather_placed_against_the_hand_ring(quiz):
    seen = set()
    for q in seeded(quiz, "gather-placed"):
        ms, link, t, nodes = gather_case(q)
        seen.add((node_of(q.prompt_text()), nodes == 1, link))
        assert q.value() == pytest.approx(ms, rel=0.012) and q.value() >= ms * (1 - 1e-9)
        assert q.grade(f"{ms:.6g} ms") and q.grade(f"{ms / 1e3:.6g} s")
        assert f"({link})" in q.explanation_text() or nodes == 1
        others = [v * 1e3 for k, v in t.items() if k != link]
        if nodes == 1 and node_of(q.prompt_text())[1]:    # one node: the NIC would be the wrong link
            gpu, nics, gbps = node_of(q.prompt_text())
            others.append(q.numbers["v_gb"] * GB / (gbps / 8 * GB * NIC_REACHED) * 1e3)
        for wrong in others:
            assert not q.grade(wrong), (q.prompt_text(), wrong, ms)
    kinds = {k for k, _, _ in seen}
    assert len(kinds) == len(NODES) - 1                  # every node type but H200 is drawn
    assert {one for _, one, _ in seen} == {True, False}  # one-node groups and spread ones
    assert {link for _, _, link in seen} == {"NVLink", "PCIe", "network"}


def test_gather_placed_named_case(quiz):
    """64 H100s filling 8 DGX nodes, 70B's bf16 weights: the 8 NICs of a node carry one rank's
    63/64 x S at 8 x 47 GB/s; NVLink's 7/8 of it at 370 GB/s is faster."""
    for seed in range(5000):
        q = quiz.seed(seed)._get("gather-placed")
        n = q.numbers
        if (n["node_name"], n["ranks"], n["per_node"], n["model"]) == ("dgx-h100", 64, 8, "Llama-3-70B"):
            break
    else:
        raise AssertionError("no seed draws the named case")
    s = 2 * 70_553_706_496
    network, nvlink = 63 / 64 * s / (8 * 47e9), 7 / 8 * 63 / 64 * s / 370e9
    assert nvlink < network
    assert q.value() == pytest.approx(network * 1e3, rel=0.01)
    assert not q.grade(nvlink * 1e3) and not q.grade(63 / 64 * s / 47e9 * 1e3)   # NVLink; one NIC a rank


def test_fsdp_reduce_scatter_against_the_hand_ring(quiz):
    tps = set()
    for q in seeded(quiz, "fsdp-reduce-scatter"):
        prompt = q.prompt_text()
        dp, tp = map(int, re.search(r"FSDP2 over (\d+) ranks and tensor parallelism (\d+)", prompt).groups())
        nodes = int(re.search(r"GPUs, (\d+) ", prompt).group(1))
        s = 2 * params(model_of(prompt)) // tp
        assert f"S = 2 B x psi / {tp} = {s / GB:.2f} GB" in prompt
        k = 8 // tp                                    # rank = tp_rank + tp x dp_rank: a node holds 8 / tp
        t = links((dp - 1) / dp * s, k, nodes, node_of(prompt))
        ms = max(t.values()) * 1e3
        assert max(t, key=t.get) == "network"
        assert q.value() == pytest.approx(ms, rel=0.012) and q.value() >= ms * (1 - 1e-9)
        assert q.grade(ms)
        nic = node_of(prompt)[2] / 8 * GB * NIC_REACHED
        one_nic, all_nics = (dp - 1) / dp * s / nic * 1e3, (dp - 1) / dp * s / (8 * nic) * 1e3
        if k > 1:
            assert not q.grade(one_nic)
        if k < 8:
            assert not q.grade(all_nics)
        assert not q.grade(2 * ms)                     # an all-reduce's volume
        tps.add(tp)
    assert tps == {1, 2, 4, 8}


def test_topology_traps_name_the_mistake(quiz, capsys):
    for q in seeded(quiz, "fsdp-reduce-scatter"):
        if q.numbers["tp"] == 4:
            break
    quiz.answer("fsdp-reduce-scatter", q.numbers["one_nic_ms"])
    assert "spread over 2 NICs" in capsys.readouterr().out
    for q in seeded(quiz, "gather-placed"):
        if q.numbers["nodes"] > 1 and q.numbers["per_node"] > 1 and q.numbers["node_name"] == "dgx-a100":
            break
    quiz.answer("gather-placed", q.numbers["own_nic_ms"])
    assert "one NIC of its own" in capsys.readouterr().out


# -- section 4: alpha-beta, the drawing, the schedules -------------------------------------------

def test_alpha_beta_table_by_hand():
    from gpumem.chapters.ch06_combining_strategies import timing_cells
    text = timing_cells.alpha_beta_table()
    s = 2 * params("Llama-3-70B")
    hand = {"in one node": (7 / 8 * s / 370e9, "NVLink"), "one per node": (7 / 8 * s / 47e9, "network"),
            "8 full nodes": (max(63 / 64 * s / (8 * 47e9), 7 / 8 * 63 / 64 * s / 370e9), "network")}
    for key, (seconds, link) in hand.items():
        line = next(ln for ln in text.splitlines() if key in ln)
        ms = float(re.search(r"([\d,.]+) ms", line).group(1).replace(",", ""))
        assert ms == pytest.approx(seconds * 1e3, rel=0.01) and f" {link} " in line
    assert max(len(ln) for ln in text.splitlines()) <= 100
    assert "7.9x" in timing_cells.alpha_beta_sentence()          # (7/8 S / 47) / (7/8 S / 370)
    assert round((370 / 47), 1) == 7.9


def test_topology_drawing_from_the_node_type_and_by_hand():
    from gpumem.chapters.ch06_combining_strategies import topology
    text = topology.drawing()
    assert max(len(ln) for ln in text.splitlines()) <= 100
    assert "450 GB/s per GPU per direction" in text and "8 per node, 50 GB/s each" in text
    assert "source [nics, nic_bw]" in text and "InfiniBand NDR fabric" in text
    a100 = topology.drawing("dgx-a100")
    assert "300 GB/s per GPU per direction" in a100 and "25 GB/s each" in a100
    rows = [ln.split() for ln in text.splitlines() if ln.startswith(("tp ", "cp ", "dp "))]
    assert rows[0] == ["tp"] + ["a"] * 8 + ["b"] * 8                   # tp=8 x dp=2
    assert rows[1] == ["dp"] + list("abcdefgh") * 2
    assert rows[2] == ["tp"] + list("aaaabbbbccccdddd")              # tp=4 x cp=2 x dp=2
    assert rows[3] == ["cp"] + list("abcdabcdefghefgh")
    assert rows[4] == ["dp"] + list("abcdefgh") * 2
    assert text.count("crosses NIC 0 of each node") == 2
    assert text.count("tp all-reduce (group a: 8 per node x 1 node) crosses NVLink (NVSwitch)") == 1
    # the dp all-reduce over 2 ranks, one per node: each rank sends 2 x 1/2 x S = S through one NIC
    psi = params("Llama-3-70B")
    times = [float(m.replace(",", "")) for m in re.findall(r"tp shard, once a step\): ([\d,.]+) ms", text)]
    assert times[0] == pytest.approx(2 * psi / 8 / 47e9 * 1e3, rel=0.01)
    assert times[1] == pytest.approx(2 * psi / 4 / 47e9 * 1e3, rel=0.01)


def test_schedule_table_by_hand():
    """p = 8: 1F1B and GPipe (p-1)/m, interleaved (p-1)/(v m), ZB-H1 (p-1)/(3 m) with F = B-W = W,
    ZB-H2 0; first stage m (GPipe), p, p + (p-1)/v, p, 2p - 1; sends 2 m (v times interleaved)."""
    from gpumem.chapters.ch06_combining_strategies import timing_cells
    text = timing_cells.schedule_table()
    p = 8
    want = {("GPipe", 1): (7 / 32, 32), ("1F1B", 1): (7 / 32, 8), ("interleaved 1F1B", 2): (7 / 64, 8 + 7 / 2),
            ("interleaved 1F1B", 4): (7 / 128, 8 + 7 / 4), ("ZB-H1", 1): (7 / 96, 8), ("ZB-H2", 1): (0, 15)}
    for (name, v), (bubble, held) in want.items():
        line = next(ln for ln in text.splitlines() if re.match(rf"{re.escape(name)}\s+{v}\s+32 ", ln))
        cols = line[len(name):].split()
        assert float(cols[2].rstrip("%")) == pytest.approx(100 * bubble, abs=0.05)
        assert float(cols[4]) == pytest.approx(held)
        assert int(cols[5]) == 2 * 32 * v
        assert float(cols[6].replace(",", "")) == pytest.approx(2 * 32 * v * 4096 / 8 * 8192 * 2 / 1e6, abs=1)
    assert re.search(r"ZB-H2\s+1\s+8\s+refused: zb-h2 needs m >= 2p-1 = 15", text)
    assert "with an optimizer step that waits for all stages, 7.3%" in " ".join(text.split())   # ZB-H1's
    assert f"{100 * (p - 1) / 96:.1f}" == "7.3"
    assert max(len(ln) for ln in text.splitlines()) <= 100


# -- section 7: the slow network on node types ---------------------------------------------------

def test_slow_network_statements_and_hybrid_sharding_by_hand():
    """Section 7's prose: InfiniBand -> ZeRO-3 hidden; one 100 Gb/s port -> ZeRO-3 still hides
    with one micro-batch a step; one 25 Gb/s port -> exposed seconds; one 10 Gb/s port -> ZeRO-1
    with the optimizer offloaded; MiCS exposes least on every Ethernet row, about half of ZeRO-1.
    By hand (one port per node, 2 nodes): MiCS: 8 groups of 2 ranks each all-reduce 2 psi / 8
    (2 x 1/2 x S per rank), all through the node's port: 2 psi; ZeRO-1: reduce-scatter and
    all-gather of 2 psi over 16 ranks, one rank's 15/16 through the port, twice."""
    from gpumem.chapters.ch06_combining_strategies import timing_cells as tc
    nets = tc.networks()
    rates = [node.nics * node.nic_bw * 8 / 1e9 for _, node in nets]
    assert rates == [8 * 200, 100, 25, 10]
    best = [tc.slow_plan(node).best for _, node in nets]
    assert best[0].layout.zero == 3 and best[0].time["data_parallel"] == 0
    assert best[1].layout.zero == 3 and best[1].layout.n_micro == 1 and best[1].time["data_parallel"] < 0.01
    assert best[2].layout.zero == 3 and best[2].time["data_parallel"] > 1
    assert best[3].layout.zero == 1 and best[3].layout.offload != "none" and "optimizer" in best[3].layout.label()
    psi = params("Llama-3-8B")
    for (_, node), gbps in zip(nets[1:], (100, 25, 10)):
        port = gbps / 8 * GB * NIC_REACHED
        r = tc.slow_layouts(node)
        exposed = {k: v["exposed_s"] for k, v in r.items()}
        assert min(exposed, key=exposed.get) == "mics"
        assert exposed["mics"] == pytest.approx(2 * psi / port, rel=0.01)
        assert exposed["zero1"] == pytest.approx(2 * 15 / 16 * 2 * psi / port, rel=0.01)
        assert 0.45 < exposed["mics"] / exposed["zero1"] < 0.6
    ib = tc.slow_layouts(nets[0][1])
    assert ib["zero3"]["exposed_s"] == 0 and all(v["exposed_s"] < 0.5 for v in ib.values())
    assert ib["mics"]["states_bytes"] == pytest.approx(2 * ib["zero3"]["states_bytes"], rel=1e-3)
    assert max(len(ln) for ln in tc.slow_network_table().splitlines()) <= 100


# -- the notebook --------------------------------------------------------------------------------

def test_notebook_section_4_and_renumbered_sections():
    nb = nbformat.read(ROOT / "notebooks" / "06_combining_strategies.ipynb", as_version=4)
    heads = [ln for c in nb.cells if c.cell_type == "markdown" for ln in c.source.splitlines()
             if ln.startswith("## ") and "·" in ln]
    assert [int(h.split()[1]) for h in heads] == list(range(1, 13))
    assert heads[3] == "## 4 · The time model: collectives, links, schedules"
    i = next(j for j, c in enumerate(nb.cells) if "### How close is the model? Published runs" in c.source)
    j = next(j for j, c in enumerate(nb.cells) if c.source.startswith("## 5 · "))
    assert "validate.table(runs)" in nb.cells[i + 1].source and i + 1 < j       # the validation table
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "50e9" not in code and "1.25e9" not in code and "memory import speed" not in code
    for call in ("alpha_beta_table()", "topology.drawing()", "schedule_table()", "slow_network_table()"):
        assert call in code
