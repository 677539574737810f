"""Chapter 04's diagrams and tables, rendered from the library's numbers: the opening problem, the
online softmax step by step, which tiles a causal kernel computes, the measured results and the
FLOP and HBM-traffic model."""

import math

from gpumem import units
from gpumem.course.drawing import bar, box
from gpumem.memory import attention_flops, gpus, models

from . import claims


def problem_box(model: str = "llama-3-70b", seq: int = 4096, batch: int = 16, gpu: str = "h100-80gb") -> str:
    """The score matrices a naive kernel would keep, from one head up to the note's whole batch."""
    cfg, g = models.get(model), gpus.get(gpu)
    steps = [("one head, one layer, one sequence", claims.scores(seq)),
             (f"x {cfg.n_heads} query heads = one layer", claims.scores(seq, cfg.n_heads)),
             (f"x {cfg.n_layers} layers", claims.scores(seq, cfg.n_heads, cfg.n_layers)),
             (f"x batch {batch}", claims.scores(seq, cfg.n_heads, cfg.n_layers, batch))]
    top = steps[-1][1]
    lines = [f"fp32 scores S = QK^T, s = {seq:,}: one s x s matrix per query head"]
    for label, b in steps:
        lines.append(f"{label:36s} {units.fmt(b, 'GiB', 2):>14s}  {bar(int(math.log2(b)), int(math.log2(top)), 16)}")
    lines += ["(bars on a log2 scale)",
              f"one {g.label} reports {units.fmt(g.capacity, 'GiB', 1)}: the batch's scores fill {top / g.capacity:,.0f}",
              f"FlashAttention keeps one fp32 logsumexp per head and row instead: "
              f"{units.fmt(4 * seq * cfg.n_heads * cfg.n_layers * batch, 'GiB', 2)}"]
    return box(f"{cfg.name}: what a naive attention kernel keeps for backward", lines)


def online_softmax_trace(scores: list[float], block: int) -> list[dict]:
    """The online softmax of one row, block by block: the running max m, the running sum l of
    exp(x - m) (rescaled by exp(m_old - m_new) when m grows), after each block."""
    m, l, out = -math.inf, 0.0, []
    for j0 in range(0, len(scores), block):
        blk = scores[j0:j0 + block]
        m_new = max(m, max(blk))
        correction = math.exp(m - m_new) if m > -math.inf else 0.0
        l = l * correction + sum(math.exp(x - m_new) for x in blk)
        out.append({"block": blk, "m_old": m, "m": m_new, "correction": correction, "l": l})
        m = m_new
    return out


def online_softmax_diagram(scores: list[float], block: int = 3) -> str:
    """The trace as a diagram, then softmax from the final m and l beside the two-pass softmax."""
    steps = online_softmax_trace(scores, block)
    lines = [f"row of scores: {', '.join(f'{x:g}' for x in scores)}   (blocks of {block})", ""]
    for i, st in enumerate(steps):
        old = "-inf" if st["m_old"] == -math.inf else f"{st['m_old']:g}"
        lines.append(f"block {i}: [{', '.join(f'{x:g}' for x in st['block'])}]")
        lines.append(f"   m = max({old}, {max(st['block']):g}) = {st['m']:g}   rescale old sum by "
                     f"exp({old} - {st['m']:g}) = {st['correction']:.4f}")
        lines.append(f"   l = {st['l']:.4f}")
    m, l = steps[-1]["m"], steps[-1]["l"]
    online = [math.exp(x - m) / l for x in scores]
    full_m = max(scores)
    total = sum(math.exp(x - full_m) for x in scores)
    two_pass = [math.exp(x - full_m) / total for x in scores]
    lines += ["", "softmax = exp(x - m) / l : " + " ".join(f"{p:.3f}" for p in online),
              "two-pass softmax         : " + " ".join(f"{p:.3f}" for p in two_pass),
              f"largest difference {max(abs(a - b) for a, b in zip(online, two_pass)):.1e}; "
              f"logsumexp = m + log(l) = {m + math.log(l):.4f}"]
    return box("online softmax: one pass over the blocks, nothing stored but m and l", lines)


def tiles_diagram(s_q: int, s_k: int, block: int, causal: bool = True) -> str:
    """Which (query block, key block) tiles a tiled kernel computes: # whole, / on the diagonal, . skipped."""
    rows = []
    for i0 in range(0, s_q, block):
        i1 = min(i0 + block, s_q)
        cells = ""
        for j0 in range(0, s_k, block):
            j1 = min(j0 + block, s_k)
            cells += "." if causal and j0 > i1 - 1 else "/" if causal and j1 - 1 > i0 else "#"
        rows.append(f"q {i0:5d}-{i1 - 1:<5d} {cells}")
    done = attention_flops.visible_pairs(s_q, s_k, causal, block)
    lines = rows + ["", f"# every score computed, / partly masked (computed, then set to -inf), . skipped",
                    f"scores computed: {done:,} of {s_q * s_k:,} ({100 * done / (s_q * s_k):.0f} %)"]
    return box(f"tiles of {block} x {block}, s_q {s_q}, s_k {s_k}{', causal' if causal else ''}", lines, width=60)


def attention_table(result: dict) -> str:
    """The measured bytes per sequence length and method, with the formula and the ratios (``run``'s table)."""
    if "backends" in result:        # the GPU path
        lines = [f"{result['device']}: SDPA backends, s {result['seq']:,}, {result['heads']} heads of {result['head_dim']}"]
        for name, r in result["backends"].items():
            lines.append(f"  {name:18s} " + (r["error"] if "error" in r else
                         f"peak above inputs {units.fmt(r['peak_above_inputs'], 'MiB', 1):>12s}  {r['seconds'] * 1e3:8.2f} ms"))
        return "\n".join(lines)
    sh = result["shape"]
    lines = [f"attention core on the CPU: batch 1, {sh['heads']} query / {sh['kv_heads']} key-value heads of "
             f"{sh['head_dim']}, fp32{', causal' if sh['causal'] else ''}; tiled key block {sh['block']}",
             f"SDPA ran: {result['sdpa_backend']}",
             f"{'s':>6s} {'method':7s}{'peak fwd':>13s}{'peak bwd':>13s}{'saved':>13s}{'formula':>13s}  (MiB)"]
    for r in result["rows"]:
        lines.append(f"{r['seq']:6d} {r['method']:7s}" + "".join(
            f"{r[k] / 2**20:13,.2f}" for k in ("peak_forward", "peak_backward", "saved", "formula_saved")))
    lines.append("ratio when s doubles (largest pair measured):")
    for key in ("peak_forward", "peak_backward", "saved"):
        parts = [f"{m} {v[-1][2]:.2f}x" for m, v in result["ratios"][key].items()]
        lines.append(f"  {key:14s} " + ", ".join(parts))
    d = result["max_difference"]
    lines.append(f"tiled vs SDPA at s {d['seq']} ({d['dtype']}): max |diff| out {d['out']:.1e}, dq {d['dq']:.1e}, "
                 f"dk {d['dk']:.1e}, dv {d['dv']:.1e}")
    return "\n".join(lines)


def flops_table(model: str = "llama-3-70b", seqs=(2048, 8192, 32768), gpu: str = "h100-80gb", block: int = 128) -> str:
    """Per layer of ``model`` (one sequence, bf16): matmul FLOPs, HBM bytes and the roofline bound
    of naive and tiled attention, forward + backward."""
    cfg = models.get(model)
    lines = [f"{cfg.name}, one layer, batch 1, bf16, {gpus.get(gpu).label}; tiled query block {block}",
             f"{'s':>7s} {'kernel':7s}{'TFLOP':>9s}{'HBM GB':>10s}{'FLOP/B':>9s}{'bound ms':>10s}  bound by"]
    for s in seqs:
        for method in ("naive", "tiled"):
            r = attention_flops.roofline(method, s, cfg.n_heads, cfg.head_dim, 1, gpu, 2, block)
            lines.append(f"{s:7d} {method:7s}{r['flops'] / 1e12:9.2f}{r['bytes'] / 1e9:10.2f}{r['intensity']:9.0f}"
                         f"{r['bound_s'] * 1e3:10.2f}  {r['bound_by']}")
    return "\n".join(lines)
