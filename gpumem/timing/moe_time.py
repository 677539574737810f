"""Expert parallelism's all-to-all: its bytes and seconds per step (torch-free).

A mixture-of-experts layer under expert parallelism (``ep`` ranks split the experts) sends each
token's hidden state to the ranks holding its top-k experts (dispatch) and brings the experts'
outputs back (combine): two all-to-alls in forward, and in backward the same two carrying the
gradients the other way, 4 per MoE layer per micro-batch (Lepikhin et al. 2020, GShard, arXiv
2006.16668: dispatch and combine; Rajbhandari et al. 2022, DeepSpeed-MoE, arXiv 2201.05596;
Megatron-Core's ``MoEAlltoAllTokenDispatcher``, whose dispatch and combine are all-to-alls over the
ep group, ``megatron/core/transformer/moe/token_dispatcher.py``). A re-run forward under
activation checkpointing sends dispatch and combine again.

Bytes. Each rank's send buffer is S = rows x h x e: rows = c x T x k dispatched rows
(``memory.moe_acts.dispatched_rows``: T tokens of the rank's micro-batch, k experts each, c the
capacity factor the activations are counted at), h = d_model, e bytes per element; with
balanced routing (n_experts / ep experts on each rank) a share 1 / ep of it stays on the rank,
so each rank sends S (ep - 1) / ep -- ``collectives.bytes_per_rank("all_to_all", S, ep)``.

Seconds: ``collectives.collective_time("all_to_all", S, group)`` over the ep group as it is
placed (NVLink inside a node when the group fits one, else the network, with NCCL's latency).
Assumption: every all-to-all is exposed (dispatch, experts and combine run in series on one
stream); Megatron-Core's ``--overlap-moe-expert-parallel-comm`` (v0.14, its MoE README) or
DeepSeek's DualPipe hide part of it (not modelled: pessimistic where they are used).
"""

from dataclasses import dataclass
from functools import lru_cache

from .collectives import bytes_per_rank, collective_time
from .hardware import Group

PER_LAYER = 4      # dispatch and combine, forward and backward (see the module)
RE_RUN = 2         # a re-run forward's dispatch and combine


def send_bytes(rows: int, d_model: int, elem_bytes: int) -> int:
    """S: one rank's all-to-all send buffer of ``rows`` dispatched rows: rows x h x e bytes."""
    return rows * d_model * elem_bytes


@dataclass(frozen=True)
class AllToAll:
    """One step's expert-parallel all-to-all on one GPU: ``calls`` collectives of ``nbytes`` (S)
    each, ``moved`` bytes sent per call, ``seconds`` in all and one call's ``describe``."""
    calls: float
    nbytes: int
    moved: float
    one_s: float
    seconds: float
    binding: str
    describe: str


@lru_cache(maxsize=1024)
def _one(nbytes: int, group: Group):
    return collective_time("all_to_all", nbytes, group)


def step(group: Group, rows: int, d_model: int, elem_bytes: int, moe_layers: int, micro_batches: int,
         rerun: float = 0.0) -> AllToAll:
    """The all-to-alls of one step: (4 + 2 x ``rerun``) per MoE layer per micro-batch, each of
    ``rows`` rows a rank (c x T x k: ``memory.moe_acts.dispatched_rows``), over ``group`` (the ep
    ranks); ``rerun``: the share of a forward re-run."""
    s = send_bytes(rows, d_model, elem_bytes)
    calls = micro_batches * moe_layers * (PER_LAYER + RE_RUN * rerun)
    if group.size == 1:
        return AllToAll(calls, s, 0.0, 0.0, 0.0, "none", "ep = 1: no all-to-all")
    t = _one(s, group)
    return AllToAll(calls, s, bytes_per_rank("all_to_all", s, group.size), t.seconds, calls * t.seconds,
                    t.binding, t.describe())
