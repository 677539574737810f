"""Chapter 04's diagrams and tables, rendered from the library's numbers: the opening problem, the
online softmax step by step, which tiles a causal kernel computes and the measured results (the
FLOP and HBM-traffic tables are in ``traffic``)."""

import math

from gpumem import units
from gpumem.course.drawing import bar, box
from gpumem.memory import attention_flops, gpus, models

from . import claims


def problem_box(model: str = "llama-3-70b", seq: int = 4096, batch: int = 16, gpu: str = "h100-80gb") -> str:
    """The probability matrices a naive kernel would keep, from one head up to the note's whole batch."""
    cfg, g = models.get(model), gpus.get(gpu)
    steps = [("one head, one layer, one sequence", claims.scores(seq)),
             (f"x {cfg.n_heads} query heads = one layer", claims.scores(seq, cfg.n_heads)),
             (f"x {cfg.n_layers} layers", claims.scores(seq, cfg.n_heads, cfg.n_layers)),
             (f"x batch {batch}", claims.scores(seq, cfg.n_heads, cfg.n_layers, batch))]
    top = steps[-1][1]
    lines = [f"fp32 probabilities P = softmax(S), s = {seq:,}: one s x s per query head"]
    for label, b in steps:
        lines.append(f"{label:36s} {units.fmt(b, 'GiB', 2):>14s}  {bar(int(math.log2(b)), int(math.log2(top)), 16)}")
    lines += ["(bars on a log2 scale)",
              f"one {g.label}: {units.fmt(g.capacity, 'GiB', 1)} in all, as CUDA reports it (no reserve",
              f"taken off): the batch's probabilities alone would fill {claims.gpus_filled(top, g.capacity)} "
              f"such GPUs",
              f"({units.fmt(top, 'GiB', 0)} / {units.fmt(g.capacity, 'GiB', 1)} = {top / g.capacity:.1f}, "
              "rounded up to whole GPUs)",
              f"FlashAttention keeps instead one fp32 logsumexp per query head and row,",
              f"for all {cfg.n_layers} layers and the batch of {batch}: "
              f"{units.fmt(4 * seq * cfg.n_heads * cfg.n_layers * batch, 'GiB', 2)}"]
    return box(f"{cfg.name}: what a naive attention kernel keeps for backward", lines)


def online_step(m: float, l: float, block: list[float]) -> tuple[float, float]:
    """One online-softmax update: the new running max and sum after ``block`` of scores, from the
    old max ``m`` and sum ``l`` = sum of exp(x - m) over the scores seen before."""
    m_new = max(m, max(block))
    kept = l * math.exp(m - m_new) if m > -math.inf else 0.0
    return m_new, kept + sum(math.exp(x - m_new) for x in block)


def online_softmax_trace(scores: list[float], block: int, values: list[float] | None = None) -> list[dict]:
    """The online softmax of one row, block by block. After each block the invariant holds:
    ``l`` = sum over the keys seen of exp(x - m) and ``acc`` = sum of exp(x - m) * v (one number
    per key in ``values``, a head dim of 1), with m the largest score seen. Each step records the
    old sum rescaled (``kept_l``) and the block's own part (``fresh_l``), likewise for acc."""
    values = values if values is not None else [0.0] * len(scores)
    m, l, acc, out = -math.inf, 0.0, 0.0, []
    for j0 in range(0, len(scores), block):
        blk, vals = scores[j0:j0 + block], values[j0:j0 + block]
        m_new, _ = online_step(m, l, blk)
        correction = math.exp(m - m_new) if m > -math.inf else 0.0
        fresh_l = sum(math.exp(x - m_new) for x in blk)
        fresh_acc = sum(math.exp(x - m_new) * y for x, y in zip(blk, vals))
        out.append({"block": blk, "values": vals, "m_old": m, "m": m_new, "correction": correction,
                    "kept_l": l * correction, "fresh_l": fresh_l, "l": l * correction + fresh_l,
                    "kept_acc": acc * correction, "fresh_acc": fresh_acc, "acc": acc * correction + fresh_acc})
        m, l, acc = m_new, l * correction + fresh_l, acc * correction + fresh_acc
    return out


def online_softmax_diagram(scores: list[float], block: int = 3, values: list[float] | None = None) -> str:
    """The trace as a diagram (l and acc updated as rescaled old part + the block's part), then
    softmax from the final m and l beside the two-pass softmax, and acc / l beside softmax . v."""
    values = values if values is not None else [1.0 + (i % 3) for i in range(len(scores))]
    steps = online_softmax_trace(scores, block, values)
    lines = [f"row of scores x: {', '.join(f'{x:g}' for x in scores)}   (blocks of {block})",
             f"values v (d = 1): {', '.join(f'{y:g}' for y in values)}",
             "after each block: l = sum over keys seen of exp(x - m), acc = sum of exp(x - m) * v", ""]
    for i, st in enumerate(steps):
        old = "-inf" if st["m_old"] == -math.inf else f"{st['m_old']:g}"
        lines.append(f"block {i}: x [{', '.join(f'{x:g}' for x in st['block'])}], "
                     f"v [{', '.join(f'{y:g}' for y in st['values'])}]")
        lines.append(f"   m   = max({old}, {max(st['block']):g}) = {st['m']:g};  "
                     f"rescale = exp({old} - {st['m']:g}) = {st['correction']:.4f}")
        lines.append(f"   l   = {st['kept_l']:.4f} (old l x rescale) + {st['fresh_l']:.4f} (block) = {st['l']:.4f}")
        lines.append(f"   acc = {st['kept_acc']:.4f} (old acc x rescale) + {st['fresh_acc']:.4f} (block) "
                     f"= {st['acc']:.4f}")
    m, l, acc = steps[-1]["m"], steps[-1]["l"], steps[-1]["acc"]
    online = [math.exp(x - m) / l for x in scores]
    full_m = max(scores)
    total = sum(math.exp(x - full_m) for x in scores)
    two_pass = [math.exp(x - full_m) / total for x in scores]
    lse = m + math.log(l)
    lines += ["", "softmax = exp(x - m) / l : " + " ".join(f"{p:.3f}" for p in online),
              "two-pass softmax         : " + " ".join(f"{p:.3f}" for p in two_pass),
              "exp(x - lse)             : " + " ".join(f"{math.exp(x - lse):.3f}" for x in scores),
              f"largest difference {max(abs(a - b) for a, b in zip(online, two_pass)):.1e}; "
              f"lse = m + log(l) = {lse:.4f}",
              f"output acc / l = {acc / l:.6f};  softmax . v = {sum(p * y for p, y in zip(two_pass, values)):.6f}"]
    return box("online softmax: one pass over the blocks, nothing stored but m, l and acc", lines, width=92)


def tiles_diagram(s_q: int, s_k: int, block: int, causal: bool = True) -> str:
    """Which (query block, key block) tiles a tiled kernel computes: # whole, / on the diagonal, . skipped."""
    head = "".join(f"{f'{j0}-{min(j0 + block, s_k) - 1}':>6s}" for j0 in range(0, s_k, block))
    rows = [f"{'':12s}{head}   <- key blocks"]
    for i0 in range(0, s_q, block):
        i1 = min(i0 + block, s_q)
        cells = ""
        for j0 in range(0, s_k, block):
            j1 = min(j0 + block, s_k)
            cells += f"{'.' if causal and j0 > i1 - 1 else '/' if causal and j1 - 1 > i0 else '#':>6s}"
        rows.append(f"q {i0:4d}-{i1 - 1:<4d} {cells}")
    done = attention_flops.visible_pairs(s_q, s_k, causal, block)
    need = attention_flops.visible_pairs(s_q, s_k, causal)
    total = s_q * s_k
    lines = rows + ["", "# every score computed, / partly masked (computed, then set to -inf), . skipped",
                    f"scores computed: {done:,} of {total:,} ({100 * done / total:.0f} %); "
                    f"needed (key j <= query i): {need:,} of {total:,}"]
    return box(f"tiles of {block} x {block}, s_q {s_q}, s_k {s_k}{', causal' if causal else ''}", lines, width=92)


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


def gqa_table(result: dict) -> str:
    """``experiments.gqa_saved`` as a table: bytes saved for backward per kernel, chapter 01's
    formula beside them, and how many heads the saved K and V carry."""
    r = result
    lines = [f"GQA, measured: {r['heads']} query heads over {r['kv_heads']} key/value heads of {r['head_dim']}, "
             f"s {r['seq']:,}, batch 1, {r['dtype']}, CPU",
             f"{'kernel':36s}{'K, V saved as':>16s}{'saved MiB':>12s}{'formula MiB':>13s}{'to the byte':>13s}"]
    for name, row in r["rows"].items():
        heads = f"{row['kv_heads_saved']} heads"
        same = "equal" if row["saved"] == row["formula_saved"] else "differ"
        lines.append(f"{name:36s}{heads:>16s}{row['saved'] / 2**20:12.2f}{row['formula_saved'] / 2**20:13.2f}"
                     f"{same:>13s}")
    return "\n".join(lines)
