"""Context parallelism (ring attention) against hand counts from first principles: the bytes a rank
sends, where the ring is hidden, which link binds. Torch-free, well under a second."""

import pytest

from gpumem.errors import UsageError
from gpumem.timing import collectives
from gpumem.timing import context_parallel as C
from gpumem.timing.hardware import NODES, Group

H100 = NODES["dgx-h100"]
# Llama-3-70B (Meta's config.json: hidden_size 8192, 64 attention heads, 8 key/value heads), bf16
LLAMA70 = dict(d_model=8192, n_heads=64, n_kv_heads=8, micro_batch=1, tp=8, elem_bytes=2)
HUGE = 1e30             # FLOPs: attention that outlasts any send


def test_llama70_bytes_by_hand():
    """s = 8192 over cp = 2: each rank holds 4096 tokens; tp = 8 leaves 8 / 8 = 1 KV head of
    8192 / 64 = 128 dims; K and V, 2 bytes each: 2 x 4096 x 1 x 128 x 2 = 2 MiB per chunk. Forward
    sends it cp - 1 = 1 time; backward K,V again plus dK,dV: twice that."""
    chunk = 2 * 4096 * 1 * 128 * 2
    assert chunk == 2 * 2**20
    assert C.kv_chunk_bytes(seq=8192, cp=2, **LLAMA70) == chunk
    r = C.ring_attention(H100, **LLAMA70, seq=8192, cp=2, attention_flops=HUGE, flops_per_s=1e15)
    assert (r.bytes_forward, r.bytes_backward) == (chunk, 2 * chunk)
    # cp = 16 at 131,072 tokens: 8192 tokens per rank, 4 MiB chunks, 15 sends forward, 30 chunks backward
    r16 = C.ring_attention(H100, **LLAMA70, seq=131072, cp=16, attention_flops=HUGE, flops_per_s=1e15)
    assert r16.kv_chunk == 2 * 8192 * 128 * 2 == 4 * 2**20
    assert (r16.bytes_forward, r16.bytes_backward) == (15 * 4 * 2**20, 30 * 4 * 2**20)


def test_all_gather_moves_the_same_bytes():
    """An all-gather of cp chunks sends (cp - 1) / cp of them from each rank: cp - 1 chunks, as the ring."""
    ring = C.ring_attention(H100, **LLAMA70, seq=32768, cp=4, attention_flops=HUGE, flops_per_s=1e15)
    ag = C.ring_attention(H100, **LLAMA70, seq=32768, cp=4, attention_flops=HUGE, flops_per_s=1e15,
                          scheme="all_gather")
    assert (ag.bytes_forward, ag.bytes_backward) == (ring.bytes_forward, ring.bytes_backward) == (
        3 * ring.kv_chunk, 6 * ring.kv_chunk)
    assert ring.seconds_exposed == 0 and ag.seconds_exposed == ag.seconds_comm > 0   # exposed by design


def test_attention_flops_by_hand():
    """S = QK^T and O = PV: 2 x 2 s^2 h per sequence; over tp x cp ranks; half visible when causal."""
    assert C.attention_flops(8192, 8192, 1, 8, 2, causal=False) == 4 * 8192**3 / 16
    assert C.attention_flops(8192, 8192, 1, 8, 2) == 2 * 8192**3 / 16


def test_exposed_is_zero_when_attention_is_large_and_all_when_none():
    big = C.ring_attention(H100, **LLAMA70, seq=8192, cp=2, attention_flops=HUGE, flops_per_s=1e15)
    assert big.seconds_comm > 0 and big.seconds_exposed == 0
    none = C.ring_attention(H100, **LLAMA70, seq=8192, cp=2, attention_flops=0, flops_per_s=1e15)
    assert none.seconds_exposed == pytest.approx(none.seconds_comm)


def test_exposed_per_step_by_hand():
    """cp = 4: forward 3 sends of a chunk, backward a chunk, 2 double chunks, a chunk; each step hides
    behind 1/cp of the attention. With attention that lasts exactly one chunk's send per step forward,
    forward hides; backward (2.5 x) hides too. With a tenth of that, each step exposes the rest."""
    shape = dict(LLAMA70, tp=2)                                 # cp ranks 2 apart: one node, NVLink
    r = C.ring_attention(H100, **shape, seq=32768, cp=4, attention_flops=0, flops_per_s=1.0)
    g = Group(H100, 2, 1)
    one = collectives.collective_time("send_recv", r.kv_chunk, g).seconds
    two = collectives.collective_time("send_recv", 2 * r.kv_chunk, g).seconds
    assert r.seconds_comm == pytest.approx(3 * one + (one + 2 * two + one))
    flops = 4 * one                                              # per rank: one step = one send, at 1 FLOP/s
    hid = C.ring_attention(H100, **shape, seq=32768, cp=4, attention_flops=flops, flops_per_s=1.0)
    assert hid.seconds_exposed == pytest.approx(2 * max(0, two - 2.5 * one))
    part = C.ring_attention(H100, **shape, seq=32768, cp=4, attention_flops=flops / 10, flops_per_s=1.0)
    c_f, c_b = one / 10, 2.5 * one / 10
    assert part.exposed_forward == pytest.approx(3 * (one - c_f))
    assert part.exposed_backward == pytest.approx(2 * (one - c_b) + 2 * (two - c_b))


def test_inside_a_node_nvlink_across_nodes_the_nic():
    """tp = 2, cp = 4: ranks 0, 2, 4, 6 of one DGX: NVLink. tp = 8: each CP rank on its own node, the
    send crosses one 400 Gb/s NIC (50 GB/s per direction), so it takes at least chunk / 50 GB/s and
    far longer than over NVLink (450 GB/s per direction)."""
    inside = C.ring_attention(H100, **dict(LLAMA70, tp=2), seq=32768, cp=4, attention_flops=0, flops_per_s=1.0)
    assert inside.binding == "NVLink"
    across = C.ring_attention(H100, **LLAMA70, seq=131072, cp=16, attention_flops=0, flops_per_s=1.0)
    assert across.binding == "network"
    assert C.cp_group(H100, 8, 16).nodes == 16 and C.cp_group(H100, 2, 4).nodes == 1
    sends = 15 + 16                                              # forward steps + backward steps
    assert across.seconds_comm > (15 * 1 + 2 + 14 * 2) * across.kv_chunk / 50e9
    assert across.seconds_comm < (15 * 1 + 2 + 14 * 2) * across.kv_chunk / (0.9 * 50e9) + sends * 50e-6
    # cp = 8 with tp = 2 fills 16 GPUs: 4 ranks per node, the boundary hop binds
    assert C.cp_group(H100, 2, 8) == Group(H100, 4, 2)
    mixed = C.ring_attention(H100, **dict(LLAMA70, tp=2), seq=65536, cp=8, attention_flops=0, flops_per_s=1.0)
    assert mixed.binding == "network"


def test_when_it_pays_break_even_by_hand():
    """A step's attention, 2 b t^2 h / tp FLOPs (causal) for t tokens per rank, equals its send,
    latency + 2 b t (g/tp) d e / bandwidth, at one t: found here from the step times directly."""
    rate = 400e12
    w = C.when_it_pays(H100, **LLAMA70, seq=131072, flops_per_s=rate)
    t = w.tokens_per_rank
    g = Group(H100, 1, 2)

    def slack(t):            # forward: one chunk against the step; backward: two chunks against 2.5 x
        chunk, attention = 2 * t * 1 * 128 * 2, 2 * t * t * 8192 / 8 / rate
        send = [collectives.collective_time("send_recv", n * chunk, g).seconds for n in (1, 2)]
        return min(attention - send[0], 2.5 * attention - send[1])
    assert slack(t) >= 0 > slack(t - 2)
    assert w.binding == "network"
    # at 131,072 tokens cp may grow while s/cp stays above t
    assert w.max_hidden_cp == max(c for c in (2, 4, 8, 16, 32, 64) if 131072 // c >= t)
    assert "memory" in w.text and "cp=16" in w.text


def test_buffer_bytes_by_hand():
    """cp = 16 at 131,072 tokens, tp = 8: K,V chunk 4 MiB, Q chunk 8192 x 8 heads x 128 x 2 = 16 MiB.
    TE's forward keeps 16 chunks and 16 partial outputs; the paper's ring two chunks."""
    kw = dict(LLAMA70, seq=131072, cp=16)
    te = C.ring_buffer_bytes(**kw)
    assert te["forward"] == 16 * 4 * 2**20 + 16 * 16 * 2**20
    assert te["backward"] == 5 * 4 * 2**20 + 16 * 2**20
    assert te["peak"] == te["forward"]
    assert C.ring_buffer_bytes(**kw, scheme="ring")["forward"] == 2 * 4 * 2**20
    assert C.ring_buffer_bytes(**kw, scheme="all_gather")["backward"] == 2 * 16 * 4 * 2**20
    assert C.ring_buffer_bytes(**dict(kw, cp=1))["peak"] == 0


def test_local_sequence():
    assert C.local_sequence(131072, 16) == 8192 and C.local_sequence(8191, 1) == 8191


@pytest.mark.parametrize("bad", [
    dict(cp=0), dict(cp=3), dict(tp=3), dict(seq=8190), dict(n_kv_heads=3), dict(elem_bytes=0),
    dict(attention_flops=-1.0), dict(flops_per_s=0.0), dict(flops_per_s=float("nan")), dict(scheme="ulysses"),
    dict(tp=16), dict(cp=2.0), dict(backward_flops=-5.0),
])
def test_bad_inputs_raise_usage_error(bad):
    kw = dict(LLAMA70, seq=8192, cp=2, attention_flops=1e12, flops_per_s=1e15)
    kw.update(bad)
    with pytest.raises(UsageError):
        C.ring_attention(H100, **kw)


def test_bad_node_and_when_it_pays_inputs():
    with pytest.raises(UsageError):
        C.ring_attention("dgx-z100", **LLAMA70, seq=8192, cp=2, attention_flops=1.0, flops_per_s=1.0)
    with pytest.raises(UsageError):
        C.when_it_pays(H100, **LLAMA70, seq=8192, flops_per_s=1e15, cp=1)
    with pytest.raises(UsageError):
        C.ring_buffer_bytes(**LLAMA70, seq=8192, cp=2, scheme="bogus")
    with pytest.raises(UsageError):            # one GPU per node and no network: no CP group of 2
        C.ring_attention("colab-t4", **dict(LLAMA70, tp=1), seq=8192, cp=2, attention_flops=1.0, flops_per_s=1.0)


def test_an_uneven_cp_group_is_priced_with_its_fewest_ranks_a_node():
    """Review r29 of lab 06: tp 4 x cp 3 (ranks 0, 4, 8 on nodes of 8: two on the first node, one on
    the second) passed Megatron-Core's rules and then raised in step_seconds. It is priced as the
    planner's other uneven groups: the node with the fewest ranks (one) binds, over two nodes. A
    regular group question still refuses it."""
    import math
    from gpumem.memory import gpus, models
    from gpumem.planner import Layout
    from gpumem.planner.cost import step_seconds
    from gpumem.timing import hardware
    from gpumem.timing.offload_time import datasheet_links
    assert C.cp_group(H100, 4, 3) == Group(H100, 1, 2)
    with pytest.raises(UsageError, match="spread unevenly"):
        hardware.Cluster(H100, 2).group(3, stride=4)
    lay = Layout("mixed", 1, "full", "flash", "none", "cpu", 1, 4, 8, 1, 128, 3, 1, "none", 0, False)
    g = gpus.get("h200")
    t = step_seconds(models.get("llama-3.1-405b"), 3072, lay, g, links=datasheet_links(g.name, ranks_on_node=8))
    assert math.isfinite(t["total"]) and t["total"] > 0
