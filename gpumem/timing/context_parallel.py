"""Context parallelism (CP): the sequence split over ``cp`` GPUs, attention by ring (torch-free).

What it is. Each of the ``cp`` ranks of a CP group holds ``s / cp`` tokens of every sequence, so
every tensor saved for backward (all are per token) shrinks by ``cp``; the weights are whole on
each rank, like data parallelism. Attention needs every earlier token's K and V, which two
schemes bring in:

* **ring** (Liu et al., "Ring Attention", arXiv:2310.01889): K,V chunks travel round the CP ranks
  in ``cp - 1`` point-to-point steps, each overlapped with the attention of the chunk already
  held. Megatron-Core runs it (``--context-parallel-size``; ``TEDotProductAttention`` picks
  ``cp_comm_type="p2p"`` by default, megatron/core/extensions/transformer_engine.py) through
  TransformerEngine's ``AttnFuncWithCPAndKVP2P``. Causal load balance: the sequence is cut into
  ``2 cp`` chunks and rank r holds chunks r and 2cp-1-r (``get_batch_on_this_cp_rank``), so every
  rank has ``2 cp`` chunk-pairs of visible work, ``1 / cp`` of its attention in each step.
* **all-gather** (Llama 3 paper, arXiv:2407.21783, sec. 3.3.2; TE ``AttnFuncWithCPAndKVAllGather``):
  K and V are all-gathered before attention, exposed; Meta accepts it because with GQA K,V are
  small next to Q, and attention is O(s^2) against the gather's O(s).

Bytes, read from the code (:data:`SOURCES` ``te``). A K,V chunk is ``2 b (s/cp) (g/tp) d e``
(K and V, micro-batch b, g/tp KV heads per tensor-parallel rank, head_dim d, e bytes). Forward:
``cp - 1`` sends of one chunk. Backward: ``cp`` sends, the first a K,V chunk, the middle ``cp - 2``
K,V plus the dK,dV accumulated so far (two chunks), the last dK,dV alone: ``2 (cp - 1)`` chunks.
The all-gather moves the same bytes per rank ((cp-1)/cp of cp chunks), exposed.

Seconds. Each ring step is one ``send_recv`` (:func:`gpumem.timing.collectives.collective_time`)
over the CP group's placement: Megatron orders ranks tp-cp-ep-dp-pp (parallel_state.py
``initialize_model_parallel``, order="tp-cp-ep-dp-pp"), so CP ranks are ``tp`` apart and a step is
as slow as its slowest hop (NVLink inside a node, one NIC on a node boundary). A step hides behind
one step of attention compute: exposed = max(0, comm - compute) per step. No step goes before
the first compute (TE posts the send of the next chunk, then attends to the chunk it holds), so
there is no separate first-step latency; nor one after the last (the final dK,dV send overlaps the
last step). Assumption: compute and a send run together at full speed (no SM contention);
effect: exposed seconds are a lower bound.

Memory. Activations per GPU scale with ``s / cp``; with flash attention the s x s score matrix
never exists. :func:`ring_buffer_bytes` gives the transient bytes on top.
"""

import math
from dataclasses import dataclass

from ..errors import UsageError, one_of
from . import collectives, hardware

SCHEMES = ("p2p", "all_gather")
BUFFER_SCHEMES = ("p2p", "ring", "all_gather")
# Backward / forward FLOPs of a tiled (flash) attention: forward S = QK^T and O = PV (4 N M d), backward
# rebuilds S then dV, dP, dQ, dK (10 N M d): gpumem.memory.attention_flops; the same 2.5 as
# Dao-AILab/flash-attention benchmarks/benchmark_flash_attention.py, flops().
BACKWARD_FACTOR = 2.5
_TE = ("NVIDIA/TransformerEngine@d0067d0 (2.20.0.dev0) transformer_engine/pytorch/attention/"
       "dot_product_attention/context_parallel.py")
SOURCES = {
    "te": _TE + ": flash_attn_p2p_communicate (lines 96-135); AttnFuncWithCPAndKVP2P.forward "
                "(1685-1717: p2p_comm_buffers[0] = cat(k, v), cp-1 sends, each posted before the "
                "step's attention), .backward (2397-2497: two (2, kv) buffers; step 0 sends kv, "
                "the last dkv, the others both); AttnFuncWithCPAndKVAllGather (3215-3216, "
                "3788-3789 gather k and v; 4107-4108 reduce-scatter dk, dv)",
    "megatron": "NVIDIA/Megatron-LM@d98e8a6 (core 0.20.0): parallel_state.py initialize_model_parallel "
                "(order 'tp-cp-ep-dp-pp'); training/arguments.py line 1337 (seq-length a multiple "
                "of 2 x context-parallel-size); transformer_config.py cp_comm_type ('all_gather ... "
                "cannot be overlapped')",
    "ring": "Liu, Zaharia, Abbeel, Ring Attention with Blockwise Transformers, arXiv:2310.01889",
    "llama3": "Llama 3 paper, arXiv:2407.21783, sec. 3.3.2 (all-gather CP), Table 4 (cp=16 at 131,072 tokens)",
}
WHEN_IT_PAYS = (
    "Context parallelism is for long sequences. It divides every saved activation by cp (each is "
    "per token) at the price of a ring of K,V sends per layer, hidden when a step's attention "
    "(quadratic in the tokens per rank) outlasts its send (linear): above a break-even number of "
    "tokens per rank. At 8k tokens a 70B model's activations fit with tensor parallelism and "
    "checkpointing, and cp only adds sends and smaller matmuls: it rarely pays unless memory "
    "forces it. At 128k tokens one sequence's activations do not fit on a node; Llama 3 405B "
    "used cp=16 with tp=8 (arXiv:2407.21783, Table 4).")


def _count(value, name: str, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise UsageError(f"{name} must be an integer >= {least}, got {value!r}")
    return value


def _positive(value, name: str, zero_ok: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (value == 0 and not zero_ok):
        raise UsageError(f"{name} must be a {'non-negative' if zero_ok else 'positive'} number, got {value!r}")
    return float(value)


def local_sequence(seq: int, cp: int) -> int:
    """Tokens per CP rank, ``seq / cp``; Megatron needs ``seq`` a multiple of ``2 cp`` (the causal
    load balance cuts it into 2 cp chunks: training/arguments.py line 1337)."""
    _count(seq, "sequence length"), _count(cp, "cp")
    if cp > 1 and seq % (2 * cp):
        raise UsageError(f"sequence length {seq} is not a multiple of 2 x cp = {2 * cp}")
    return seq // cp


def kv_chunk_bytes(d_model: int, n_heads: int, n_kv_heads: int, seq: int, micro_batch: int,
                   tp: int, cp: int, elem_bytes: int) -> int:
    """Bytes of one rank's K and V chunk: ``2 b (s/cp) (g/tp) (h/a) e``."""
    for v, n in ((d_model, "d_model"), (n_heads, "n_heads"), (n_kv_heads, "n_kv_heads"),
                 (micro_batch, "micro_batch"), (tp, "tp"), (elem_bytes, "elem_bytes")):
        _count(v, n)
    if d_model % n_heads or n_heads % n_kv_heads:
        raise UsageError(f"d_model {d_model} must divide by n_heads {n_heads}, and n_heads by n_kv_heads {n_kv_heads}")
    if n_kv_heads % tp:
        raise UsageError(f"n_kv_heads {n_kv_heads} must divide by tp {tp} (Megatron splits KV heads over tp)")
    return 2 * micro_batch * local_sequence(seq, cp) * (n_kv_heads // tp) * (d_model // n_heads) * elem_bytes


def attention_flops(d_model: int, seq: int, micro_batch: int, tp: int, cp: int, causal: bool = True) -> float:
    """Forward attention-core FLOPs one rank executes per layer: ``4 b s^2 h / (tp cp)``
    (S = QK^T and O = PV), halved under a causal mask, which a flash kernel skips (diagonal tiles
    counted half). Backward: :data:`BACKWARD_FACTOR` times this."""
    for v, n in ((d_model, "d_model"), (seq, "sequence length"), (micro_batch, "micro_batch"),
                 (tp, "tp"), (cp, "cp")):
        _count(v, n)
    return 4 * micro_batch * seq * seq * d_model / (tp * cp) / (2 if causal else 1)


def cp_group(node, tp: int, cp: int) -> hardware.Group:
    """The CP group's placement: ``cp`` ranks ``tp`` apart, on as many nodes as ``tp x cp`` fills; one
    spread unevenly (tp 4 x cp 3 on nodes of 8: two ranks on one node, one on the next) is priced with
    the fewest ranks a node holds, as the planner's other groups (review r29 of lab 06: it raised)."""
    node = hardware.node(node) if isinstance(node, str) else node
    _count(tp, "tp"), _count(cp, "cp")
    nodes = -(-tp * cp // node.gpus_per_node)
    return hardware.Cluster(node, nodes).group(cp, stride=tp, uneven=True)


def _hops(group: hardware.Group) -> list:
    """Two-rank groups standing for the ring's hops: inside a node, and across a node boundary."""
    hops = [hardware.Group(group.node, 2, 1)] if group.ranks_per_node > 1 else []
    return hops + ([hardware.Group(group.node, 1, 2)] if group.nodes > 1 else [])


def _step(nbytes: float, hops: list) -> tuple[float, str]:
    """Seconds of one ring step (all ranks send at once: the slowest hop) and its binding link."""
    times = [collectives.collective_time("send_recv", nbytes, h) for h in hops]
    worst = max(times, key=lambda t: t.seconds)
    return worst.seconds, worst.binding


@dataclass(frozen=True)
class RingAttention:
    """One layer's CP communication for one micro-batch on one rank (forward + backward)."""
    scheme: str
    cp: int
    kv_chunk: int                 # bytes of one K,V chunk
    bytes_forward: int            # bytes each rank sends (and receives) in forward
    bytes_backward: int
    seconds_comm: float           # all steps, forward + backward
    seconds_exposed: float        # what attention compute does not hide
    binding: str                  # "NVLink", "network", "PCIe" or "none"
    compute_step_forward: float   # attention seconds one forward step hides behind
    compute_step_backward: float
    exposed_forward: float
    exposed_backward: float

    def describe(self) -> str:
        """One line: bytes, seconds and the binding link."""
        return (f"cp={self.cp} {self.scheme}: K,V chunk {self.kv_chunk / 2**20:.2f} MiB; sends "
                f"{self.bytes_forward / 2**20:.1f} MiB fwd + {self.bytes_backward / 2**20:.1f} MiB bwd "
                f"in {self.seconds_comm * 1e6:.0f} us over {self.binding}; exposed "
                f"{self.seconds_exposed * 1e6:.0f} us (attention per step {self.compute_step_forward * 1e6:.0f}"
                f" us fwd, {self.compute_step_backward * 1e6:.0f} us bwd)")


def ring_attention(node, *, d_model: int, n_heads: int, n_kv_heads: int, seq: int, micro_batch: int,
                   tp: int, cp: int, elem_bytes: int, attention_flops: float, flops_per_s: float,
                   backward_flops: float | None = None, scheme: str = "p2p") -> RingAttention:
    """CP communication of one layer and micro-batch on ``node`` (a ``NodeType`` or its name).
    ``attention_flops``: forward attention FLOPs one rank executes per layer (e.g.
    :func:`attention_flops`); ``backward_flops`` defaults to :data:`BACKWARD_FACTOR` times it;
    ``flops_per_s``: the GPU's achieved rate. ``scheme``: ``p2p`` (ring) or ``all_gather``."""
    one_of(scheme, SCHEMES, "CP scheme")
    kv = kv_chunk_bytes(d_model, n_heads, n_kv_heads, seq, micro_batch, tp, cp, elem_bytes)
    fwd_f = _positive(attention_flops, "attention_flops", zero_ok=True)
    bwd_f = BACKWARD_FACTOR * fwd_f if backward_flops is None else _positive(backward_flops, "backward_flops", True)
    rate = _positive(flops_per_s, "flops_per_s")
    c_f, c_b = fwd_f / cp / rate, bwd_f / cp / rate
    if cp == 1:
        return RingAttention(scheme, 1, kv, 0, 0, 0.0, 0.0, "none", c_f, c_b, 0.0, 0.0)
    group = cp_group(node, tp, cp)
    if scheme == "all_gather":        # K and V gathered apart; backward gathers again, reduce-scatters dK, dV
        gather = collectives.collective_time("all_gather", cp * kv / 2, group)
        scatter = collectives.collective_time("reduce_scatter", cp * kv / 2, group)
        fwd_s, bwd_s = 2 * gather.seconds, 2 * (gather.seconds + scatter.seconds)
        return RingAttention(scheme, cp, kv, (cp - 1) * kv, 2 * (cp - 1) * kv, fwd_s + bwd_s,
                             fwd_s + bwd_s, gather.binding, c_f, c_b, fwd_s, bwd_s)
    hops = _hops(group)
    one, binding = _step(kv, hops)
    two = _step(2 * kv, hops)[0]
    bwd_steps = [one] + [two] * (cp - 2) + [one]
    exp_f = (cp - 1) * max(0.0, one - c_f)
    exp_b = sum(max(0.0, t - c_b) for t in bwd_steps)
    return RingAttention(scheme, cp, kv, (cp - 1) * kv, 2 * (cp - 1) * kv, (cp - 1) * one + sum(bwd_steps),
                         exp_f + exp_b, binding, c_f, c_b, exp_f, exp_b)


def ring_buffer_bytes(d_model: int, n_heads: int, n_kv_heads: int, seq: int, micro_batch: int,
                      tp: int, cp: int, elem_bytes: int, scheme: str = "p2p") -> dict:
    """Transient bytes CP adds on one rank during one layer's attention, beyond the per-token
    activations (already ``s / cp``): ``{"forward", "backward", "peak"}``.

    * ``p2p`` (TE's code, :data:`SOURCES` ``te``): forward keeps the list ``p2p_comm_buffers`` of
      all ``cp`` chunks (the concatenated local K,V and ``cp - 1`` received) and ``out_per_step``,
      ``cp`` partial outputs of Q's size (the rank attending to full Q every step) until the final
      correction; backward two (K,V | dK,dV) buffers (4 chunks) and one step's partial dQ, dK, dV.
    * ``ring`` (the paper's double buffer): the chunk in use and the one arriving, 2 chunks; 4 in
      backward, where dK,dV travel too.
    * ``all_gather``: the gathered K,V (``cp`` chunks); backward those and their full-length
      gradients before the reduce-scatter (``2 cp``).
    """
    one_of(scheme, BUFFER_SCHEMES, "CP buffer scheme")
    kv = kv_chunk_bytes(d_model, n_heads, n_kv_heads, seq, micro_batch, tp, cp, elem_bytes)
    if cp == 1:
        return {"forward": 0, "backward": 0, "peak": 0}
    q = kv * n_heads // (2 * n_kv_heads)         # Q (and one output) of this rank: b (s/cp) (a/tp) d e
    fwd, bwd = {"p2p": (cp * kv + cp * q, 4 * kv + q + kv), "ring": (2 * kv, 4 * kv),
                "all_gather": (cp * kv, 2 * cp * kv)}[scheme]
    return {"forward": fwd, "backward": bwd, "peak": max(fwd, bwd)}


@dataclass(frozen=True)
class WhenItPays:
    """Where the ring hides: the fewest tokens per rank, and the largest cp for ``seq``."""
    tokens_per_rank: int          # smallest s/cp (even) at which every step hides, for this cp's link
    max_hidden_cp: int | None     # largest power-of-two cp <= max_cp whose ring hides at seq
    binding: str
    text: str


def _hidden(node, shape: dict, cp: int, seq: int, flops_per_s: float, causal: bool) -> RingAttention:
    f = attention_flops(shape["d_model"], seq, shape["micro_batch"], shape["tp"], cp, causal)
    return ring_attention(node, **shape, seq=seq, cp=cp, attention_flops=f, flops_per_s=flops_per_s)


def when_it_pays(node, *, d_model: int, n_heads: int, n_kv_heads: int, seq: int, micro_batch: int,
                 tp: int, elem_bytes: int, flops_per_s: float, cp: int = 2, max_cp: int = 64,
                 causal: bool = True) -> WhenItPays:
    """The break-even of the ring on ``node``: a step's attention grows with the square of the
    tokens per rank t = s/cp (``4 b t^2 h / tp``, halved if causal), its send linearly, so the ring
    hides above a fewest t (found for ``cp``'s placement) and, for a given ``seq``, below a largest
    cp. Hiding says nothing of need: cp pays when memory forces it (:data:`WHEN_IT_PAYS`)."""
    shape = dict(d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads, micro_batch=micro_batch,
                 tp=tp, elem_bytes=elem_bytes)
    _count(cp, "cp", 2), _count(max_cp, "max_cp", 2)
    low, high = 1, 2**24                       # tokens per rank / 2 (seq a multiple of 2 cp)
    if _hidden(node, shape, cp, 2 * high * cp, flops_per_s, causal).seconds_exposed > 0:
        raise UsageError("the ring never hides below 2^25 tokens per rank at this rate")
    while low < high:
        mid = (low + high) // 2
        if _hidden(node, shape, cp, 2 * mid * cp, flops_per_s, causal).seconds_exposed > 0:
            low = mid + 1
        else:
            high = mid
    binding = _hidden(node, shape, cp, 2 * low * cp, flops_per_s, causal).binding
    best, c = None, 2
    while c <= max_cp:
        if seq % (2 * c) == 0 and _hidden(node, shape, c, seq, flops_per_s, causal).seconds_exposed == 0:
            best = c
        c *= 2
    text = (f"the ring hides from {2 * low:,} tokens per rank (cp={cp}, over {binding}); at {seq:,} "
            f"tokens the largest hidden cp is {best}. " + WHEN_IT_PAYS)
    return WhenItPays(2 * low, best, binding, text)
