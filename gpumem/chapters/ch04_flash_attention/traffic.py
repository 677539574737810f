"""Chapter 04's time tables: attention's FLOPs and HBM traffic per layer (the roofline), the same
model at the FlashAttention paper's Figure 2 setting beside the paper's measurements, and
attention's share of a layer's time.

The HBM model (``gpumem.memory.attention_flops.hbm_bytes``) charges every re-read of a K/V block
to HBM: with query blocks of 128 rows that is an upper bound on a tiled kernel's traffic, since on
a GPU many of those re-reads hit the L2 cache. Read with a query block as long as the sequence,
the same function counts K and V once per head, as if every re-read hit the cache: a lower bound.
Times on FLOPs use a stated HFU (hardware FLOPs utilisation: every FLOP the GPU runs, the
backward's recompute of S included; chapter 03), not MFU, which counts only the model's FLOPs.
"""

from gpumem.memory import attention_flops, gpus, models
from gpumem.timing import attention_time, compute

# FlashAttention paper (Dao et al. 2022, arXiv:2205.14135v2, 24 June 2022), Figure 2 left:
# forward + backward of the attention of GPT-2 medium (seq. length 1024, head dim 64, 16 heads,
# batch 64) on an A100, HBM reads + writes in GB and runtime in ms, measured.
FIG2 = {"shape": {"seq": 1024, "head_dim": 64, "heads": 16, "batch": 64, "elem": 2, "gpu": "a100-40gb"},
        "standard": {"hbm_gb": 40.3, "ms": 41.7}, "flash": {"hbm_gb": 4.4, "ms": 7.3}}


def _bounds(method: str, seq: int, heads: int, head_dim: int, batch: int, gpu: str, elem: int, block: int,
            hfu: float) -> list[tuple[str, dict]]:
    """The roofline rows of one kernel: naive once; tiled with K/V re-read per query block of
    ``block`` rows (upper bound on traffic) and with K/V read once per head (lower bound)."""
    if method == "naive":
        return [("naive", attention_time.roofline("naive", seq, heads, head_dim, batch, gpu, elem, block, hfu))]
    return [(f"tiled, {label}", attention_time.roofline("tiled", seq, heads, head_dim, batch, gpu, elem, b, hfu))
            for label, b in (("upper", block), ("lower", seq))]


def flops_table(model: str = "llama-3-70b", seqs=(2048, 8192, 32768), gpu: str = "h100-80gb", block: int = 128,
                hfu: float = compute.MFU) -> str:
    """Per layer of ``model`` (one sequence, bf16): matmul FLOPs, HBM bytes, the roofline bound of
    naive and tiled attention (forward + backward; tiled with its traffic's upper and lower bound)
    and the FLOPs' time at ``hfu`` of the peak."""
    cfg, g = models.get(model), gpus.get(gpu)
    lines = [f"{cfg.name}, one layer, batch 1, bf16, {g.label}",
             f"ridge point {attention_time.ridge(gpu):.0f} FLOP/B (peak FLOP/s over HBM bytes/s)",
             f"tiled, upper: K and V re-read from HBM for every query block of {block} rows (no cache reuse)",
             "tiled, lower: K and V read once per head (every re-read a cache hit)",
             f"{'s':>6s}  {'kernel':13s}{'TFLOP':>8s}{'HBM GB':>10s}{'FLOP/B':>8s}{'bound ms':>10s}  "
             f"{'bound by':9s}{f'ms at {hfu:.0%} HFU':>16s}"]
    for s in seqs:
        for method in ("naive", "tiled"):
            for name, r in _bounds(method, s, cfg.n_heads, cfg.head_dim, 1, gpu, 2, block, hfu):
                lines.append(f"{s:6d}  {name:13s}{r['flops'] / 1e12:8.2f}{r['bytes'] / 1e9:10,.2f}"
                             f"{r['intensity']:8,.0f}{r['bound_s'] * 1e3:10.2f}  {r['bound_by']:9s}"
                             f"{r['mfu_s'] * 1e3:16.2f}")
    return "\n".join(lines)


def fig2_rows(block: int = 128) -> dict[str, float]:
    """The HBM model at the paper's Figure 2 setting, in GB (forward + backward): naive, and tiled
    with its upper (K/V per query block of ``block``) and lower (K/V once per head) bound."""
    sh = FIG2["shape"]
    n, d, s, e = sh["heads"] * sh["batch"], sh["head_dim"], sh["seq"], sh["elem"]
    total = {name: sum(attention_flops.hbm_bytes(m, s, n, d, 1, e, b).values()) / 1e9
             for name, m, b in (("naive", "naive", block), ("tiled, upper", "tiled", block),
                                ("tiled, lower", "tiled", s))}
    return total


def fig2_table(block: int = 128) -> str:
    """The HBM model beside the FlashAttention paper's measured Figure 2 (GPT-2 medium on an A100)."""
    sh, rows = FIG2["shape"], fig2_rows(block)
    g = gpus.get(sh["gpu"])
    lines = [f"GPT-2 medium's attention: s {sh['seq']:,}, {sh['heads']} heads of {sh['head_dim']}, batch "
             f"{sh['batch']}, fp16, fwd + bwd, {g.label}",
             f"{'':30s}{'HBM GB':>10s}{'HBM time, ms':>15s}{'measured GB':>14s}{'measured ms':>14s}",
             "the course's model:"]
    for name, gb in rows.items():
        lines.append(f"  {name:28s}{gb:10.1f}{gb * 1e9 / g.hbm * 1e3:15.1f}")
    lines.append("FlashAttention paper, Figure 2 left (arXiv:2205.14135v2), measured:")
    for name, key in (("standard attention", "standard"), ("FlashAttention", "flash")):
        lines.append(f"  {name:28s}{'':25s}{FIG2[key]['hbm_gb']:14.1f}{FIG2[key]['ms']:14.1f}")
    model = rows["naive"] / rows["tiled, upper"], rows["naive"] / rows["tiled, lower"]
    paper = FIG2["standard"]["hbm_gb"] / FIG2["flash"]["hbm_gb"]
    lines.append(f"less traffic with FlashAttention: model {model[0]:.1f}x (upper) to {model[1]:.1f}x (lower); "
                 f"measured {paper:.1f}x, and {FIG2['standard']['ms'] / FIG2['flash']['ms']:.1f}x faster")
    lines.append(f"HBM time: the model's bytes at the full {g.hbm / 1e12:.3f} TB/s of the {g.label}")
    return "\n".join(lines)


def scale_table(names=("llama-3-8b", "llama-3-70b", "llama-3.1-405b"), seqs=(2048, 8192, 32768),
                gpu: str = "h100-80gb", hfu: float = compute.MFU, block: int = 128) -> str:
    """Per layer and sequence: the tiled attention core's time at ``hfu`` against the layer's weight
    matmuls (6 x layer parameters x tokens, forward + backward) at the same share of the peak."""
    lines = [f"one layer, batch 1, {gpus.get(gpu).label} at {hfu:.0%} of its peak (HFU), forward + backward",
             f"{'model':16s}{'s':>7s}{'attention ms':>14s}{'matmuls ms':>12s}{'attention share':>17s}"]
    for name in names:
        cfg = models.get(name)
        for s in seqs:
            att = attention_time.roofline("tiled", s, cfg.n_heads, cfg.head_dim, 1, gpu, 2, block, hfu)["mfu_s"]
            mat = compute.seconds(6 * cfg.layer_params() * s, gpu, hfu)
            lines.append(f"{cfg.name:16s}{s:7,d}{att * 1e3:14,.2f}{mat * 1e3:12,.2f}{100 * att / (att + mat):16.0f} %")
    return "\n".join(lines)


def delta_reread(model: str = "llama-3-70b", seq: int = 8192, block: int = 128, o_elem: int = 2) -> dict:
    """Lab 04's part 2 question: bytes of O that each ``key_block_backward`` call would read to make
    D = rowsum(dO * O) itself (every query row of every head, one layer, batch 1, O at ``o_elem`` B),
    over the ceil(seq / block) calls, against D made once in fp32 before the loop."""
    cfg = models.get(model)
    per_call = cfg.n_heads * seq * cfg.head_dim * o_elem
    calls = -(-seq // block)
    return {"per_call": per_call, "calls": calls, "in_all": per_call * calls, "d_bytes": cfg.n_heads * seq * 4}


def delta_line(model: str = "llama-3-70b", seq: int = 8192, block: int = 128, o_elem: int = 2) -> str:
    """:func:`delta_reread` in two lines (under 100 columns), in binary units."""
    r, cfg = delta_reread(model, seq, block, o_elem), models.get(model)
    mib = lambda n: f"{n / 2**20:,.0f} MiB" if n < 2**30 else f"{n / 2**30:,.0f} GiB"    # noqa: E731
    return (f"{cfg.name}, one layer, {seq:,} tokens, key blocks of {block}:\n"
            f"  O read per call {mib(r['per_call'])}, over the {r['calls']} calls {mib(r['in_all'])}; "
            f"D made once in fp32: {mib(r['d_bytes'])}")
