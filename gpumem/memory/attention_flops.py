"""Attention's work, counted: matmul FLOPs and HBM bytes of naive and FlashAttention-style kernels.

Per (batch, query head), N = s_q query rows, M = s_k keys, d = head dim, e bytes an element:

* FLOPs (multiply-adds counted as 2). Forward: S = QK^T and O = PV, 4*N*M*d. Naive backward:
  dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q, 8*N*M*d. A tiled backward first rebuilds S
  from Q, K and the logsumexp: 10*N*M*d. Causal: a naive kernel computes every score and masks
  after; a tiled kernel skips the tiles wholly above the diagonal (:func:`visible_pairs`).
* HBM traffic, each kernel reading its inputs from and writing its outputs to GPU memory once.
  Naive forward: QK^T reads Q, K and writes S; softmax reads S, writes P; PV reads P, V, writes
  O: e*(4Nd + 4NM) (d = M = N shown in the docstrings of the functions). Naive backward:
  e*(8Nd + 7NM). Tiled forward (FlashAttention-2's forward loop: a query block of B_q rows stays
  in on-chip memory while every key/value block streams past): Q read and O written once, K and
  V read once per query block, the logsumexp (fp32) written once: e*(2Nd + 2Nd*ceil(N/B_q)) + 4N.
  The re-read term is 2*N^2*d/B_q elements: quadratic in N, with coefficient 2d/B_q (2 at
  d = B_q = 128) where the naive kernel's is 4 forward and 7 backward. FlashAttention's paper
  (arXiv:2205.14135, Theorem 2) states it as Theta(N^2 d^2 / M) accesses for on-chip memory of M
  elements, against Theta(Nd + N^2) for the naive kernel: no N x N matrix is written, but the
  traffic is not linear in N.
  Tiled backward in FlashAttention-2's *backward* loop order (its Algorithm 2: key/value blocks
  outside, query blocks inside): a pre-pass D = rowsum(dO * O) reads dO and O and writes D
  (fp32); then K, V read and dK, dV written once; Q and dO read once per key block, with lse and
  D (fp32), and the dQ accumulator, kept in fp32 as FlashAttention-2 does, read and written once
  per key block (4 bytes an element, whatever e is); a last pass converts dQ to e bytes. The
  chapter's own PyTorch backward loops the other way (query blocks outside) for simplicity; this
  model is the GPU kernel's order. The model charges K and V to every query head (one head per
  thread block, as the kernels run it): GQA's sharing of K and V shows up only as L2 cache hits.

The seconds these counts take on a GPU (the roofline bound) are in
:mod:`gpumem.timing.attention_time`. Torch-free.
"""

from ..errors import positive_int


def visible_pairs(s_q: int, s_k: int, causal: bool, block: int | None = None) -> int:
    """(query, key) pairs a kernel computes: all N*M, or under a causal mask (top-left, key j
    visible to query i when j <= i) the visible ones, rounded up to whole ``block`` x ``block``
    tiles when ``block`` is given (a tiled kernel computes partly visible tiles whole)."""
    s_q, s_k = positive_int(s_q, "query length"), positive_int(s_k, "key length")
    if not causal:
        return s_q * s_k
    if block is None:
        return sum(min(i + 1, s_k) for i in range(s_q))
    pairs = 0
    for i0 in range(0, s_q, block):
        rows = min(block, s_q - i0)
        keys = min(s_k, -(-(i0 + rows) // block) * block)     # whole key blocks up to the diagonal
        pairs += rows * keys
    return pairs


def attention_flops(method: str, seq: int, heads: int, head_dim: int, batch: int = 1, causal: bool = False,
                    block: int = 128) -> dict:
    """Matmul FLOPs of one attention call, forward and backward: ``naive`` or ``tiled``."""
    n = batch * heads
    full = n * seq * seq * head_dim
    if method == "naive":
        return {"forward": 4 * full, "backward": 8 * full}
    visible = n * visible_pairs(seq, seq, causal, block) * head_dim
    return {"forward": 4 * visible, "backward": 10 * visible}


def hbm_bytes(method: str, seq: int, heads: int, head_dim: int, batch: int = 1, elem: int = 2,
              block: int = 128) -> dict:
    """Bytes moved to and from HBM by one attention call, forward and backward (see the module
    docstring: non-causal; tiled forward query-block outer, tiled backward key-block outer as in
    FlashAttention-2; fp32 dQ accumulator; K and V counted per query head)."""
    N, d, n, e = seq, head_dim, batch * heads, elem
    if method == "naive":
        fwd = e * (4 * N * d + 4 * N * N)
        bwd = e * (8 * N * d + 7 * N * N)
    else:
        passes = -(-N // block)                                    # blocks of the outer loop
        fwd = e * (N * d + 2 * N * d * passes + N * d) + 4 * N     # Q, K and V per query block, O; lse
        pre = e * 2 * N * d + 4 * N                                # D = rowsum(dO * O): read dO, O; write D
        once = e * 4 * N * d                                       # K, V read; dK, dV written
        inner = passes * (e * 2 * N * d + 4 * 2 * N * d + 4 * 2 * N)  # Q, dO; dQ (fp32) read + written; lse, D
        bwd = pre + once + inner + 4 * N * d + e * N * d           # dQ fp32 -> e
    return {"forward": n * fwd, "backward": n * bwd}
