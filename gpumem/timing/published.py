"""Published training runs the time engine is validated against: layout, batch and throughput.

Each :class:`Run` is one measured training run as a paper or a public benchmark table gives it:
the model's dimensions, sequence length, global batch (sequences), GPUs, the layout, and every
throughput figure the source prints for it, as text exactly as printed ("5,762", "44%", "17.20").
:meth:`Run.derived_tokens_per_s` turns the first of them into tokens/s for the whole job and
:meth:`Run.conversion` shows the arithmetic. A figure in FLOP/s needs the FLOPs of one token, and
each source counts them its own way; :func:`flops_per_token` implements the source's own formula:

* ``narayanan-eq3``: Narayanan et al. 2021 (arXiv:2104.04473) Eq. 3, F = 96 B s l h^2 (1 +
  s/(6h) + V/(16 l h)) per iteration: it counts the recompute forward (4 passes, not 3).
* ``megatron``: Megatron's count as NVIDIA's dgxc-benchmarking READMEs print it ("Notes"):
  12 L h^2 (1 + g/a + s/h) + 18 L F h + 6 V h per token (g: query groups, attention not halved
  for the causal mask, no embedding lookup).
* ``course``: the course's count, ``gpumem.timing.compute``: 6 x parameters + 12 L h s per token.
  torchtitan's MFU uses the same (``torchtitan/utils.py`` ``get_num_flop_per_token`` at commit
  157a12c: 6 * num_params + 12 * l * h * q * t, num_params = every parameter). The Llama 3
  paper states no formula; its runs use this one, labelled an assumption in their notes.
This module holds the oracle only (torch-free); :mod:`gpumem.planner.validate` prices each run.
"""

from dataclasses import dataclass

from ..errors import one_of
from ..memory import gpus
from ..memory.models import REGISTRY, ModelConfig
from .compute import attention_flops, train_flops

NARAYANAN = "Narayanan et al. 2021, arXiv:2104.04473"
DGXC = "NVIDIA/dgxc-benchmarking@143b90dd91f9be958fed4773ae95d941a3356a82"
TITAN = "pytorch/torchtitan@{} docs/performance.md"
LLAMA3 = "Llama 3 paper, arXiv:2407.21783, Table 4 (Sec. 3.3.2)"


@dataclass(frozen=True)
class Model:
    """A dense decoder's dimensions; ``registry`` names the course's entry when one exists."""
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    registry: str | None = None
    gated: bool = True          # SwiGLU (three FFN matrices); False: GPT's two-matrix GeLU MLP

    def config(self) -> ModelConfig:
        """The course's (SwiGLU) description; a GPT MLP (two h x F matrices) as the SwiGLU width
        2F/3: the same weights and matmul FLOPs per layer (only the memory fit sees SwiGLU's)."""
        ffn = self.ffn if self.gated else round(2 * self.ffn / 3)
        return ModelConfig(self.name, self.layers, self.hidden, self.heads, self.kv_heads, ffn, self.vocab)


def llama(name: str) -> Model:
    """The course registry's model ``name`` (its dimensions are the run's)."""
    c = REGISTRY[name]
    return Model(name, c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.ffn, c.vocab, name)


def gpt(billions: str, layers: int, hidden: int, heads: int) -> Model:
    """Narayanan et al.'s GPT: MHA, FFN 4h, vocab 51,200 (Sec. 5.1), learned positions."""
    return Model(f"gpt-{billions}b", layers, hidden, heads, heads, 4 * hidden, 51200, gated=False)


@dataclass(frozen=True)
class Layout:
    """How the GPUs are split. ``None`` = the source does not say (see the run's notes)."""
    tp: int
    pp: int
    dp: int
    cp: int = 1
    vp: int | None = 1          # virtual stages per pipeline rank (interleaved 1F1B)
    zero: int | None = None     # 0 DDP, 1 sharded optimizer, 3 FSDP / ZeRO-3
    ckpt: str | None = None     # "full", "selective", "selective-op", "none"
    micro_batch: int | None = None
    accum: int | None = None    # gradient-accumulation steps (pipeline micro-batches)
    local_batch: int | None = None  # sequences per data-parallel rank per step, as stated

    def arg(self) -> str:
        """The layout as ``plan --layout`` takes it; unknown fields are left out."""
        parts = {"tp": self.tp, "pp": self.pp, "dp": self.dp, "zero": self.zero, "ckpt": self.ckpt,
                 "mb": self.micro_batch, "vp": self.vp, "cp": self.cp}
        return ",".join(f"{k}={v}" for k, v in parts.items() if v is not None)


@dataclass(frozen=True)
class Run:
    """One measured run: model, batch, GPUs, layout and the figures as the source prints them."""
    key: str
    source: str                 # paper + table + row, or repository@commit + file + table
    framework: str
    model: Model
    seq: int
    global_batch: int           # sequences per optimizer step
    gpu: str                    # gpumem.memory.gpus key
    node: str                   # gpumem.timing.hardware node type (closest; see notes)
    gpus: int
    layout: Layout
    published: tuple[tuple[str, str], ...]   # (kind, text as printed); the first is converted
    flops: str = "course"       # the source's FLOP convention (module docstring)
    precision: str = "bf16"
    notes: str = ""
    flop_kv_heads: int | None = None  # query groups the source's FLOP formula used

    def figure(self, kind: str) -> str:
        return dict(self.published)[kind]

    def derived_tokens_per_s(self) -> float:
        """Tokens/s of the whole job from the first published figure."""
        kind, text = self.published[0]
        return tokens_per_s(self, kind, value(text))

    def conversion(self) -> str:
        kind, text = self.published[0]
        t = f"{self.derived_tokens_per_s():,.0f} tokens/s"
        if kind == "tokens/s":
            return f"{text} tokens/s (as published)"
        if kind == "tokens/s/GPU":
            return f"{text} x {self.gpus} GPUs = {t}"
        if kind == "s/step":
            return f"{self.global_batch} seq x {self.seq} tokens / {text} s = {t}"
        fpt = f"{flops_per_token(self):.4g} FLOP/token ({self.flops})"
        if kind == "MFU":
            peak = gpus.get(self.gpu).bf16_flops / 1e12
            return f"{text} x {peak:.0f} TFLOP/s x {self.gpus} GPUs / {fpt} = {t}"
        unit = {"TFLOP/s/GPU": f"TFLOP/s x {self.gpus} GPUs", "PFLOP/s": "PFLOP/s"}[kind]
        return f"{text} {unit} / {fpt} = {t}"


def value(text: str) -> float:
    """A printed figure as a number: commas dropped, "44%" -> 0.44."""
    t = text.replace(",", "").strip()
    return float(t[:-1]) / 100 if t.endswith("%") else float(t)


def half_unit(text: str) -> float:
    """Half a unit of the last printed digit, in the figure's own scale ("44%" -> 0.005)."""
    t = text.replace(",", "").strip().rstrip("%")
    decimals = len(t.split(".")[1]) if "." in t else 0
    return 0.5 * 10.0 ** -decimals / (100 if text.strip().endswith("%") else 1)


def flops_per_token(run: Run, convention: str | None = None) -> float:
    """Training FLOPs per token under the source's convention (module docstring)."""
    m, s, conv = run.model, run.seq, convention or run.flops
    L, h, V = m.layers, m.hidden, m.vocab
    if conv == "narayanan-eq3":
        return 96 * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    if conv == "megatron":
        g = run.flop_kv_heads or m.kv_heads
        return 12 * L * h * h * (1 + g / m.heads + s / h) + 18 * L * m.ffn * h + 6 * V * h
    if conv == "course":
        cfg = m.config()
        return train_flops(cfg.n_params(), 1) + attention_flops(cfg, s) / s
    raise ValueError(f"unknown FLOP convention {conv!r}")


def tokens_per_s(run: Run, kind: str, v: float) -> float:
    """Tokens/s of the whole job that a figure of ``kind`` with value ``v`` implies."""
    if kind == "tokens/s":
        return v
    if kind == "tokens/s/GPU":
        return v * run.gpus
    if kind == "s/step":
        return run.global_batch * run.seq / v
    if kind == "TFLOP/s/GPU":
        return v * 1e12 * run.gpus / flops_per_token(run)
    if kind == "PFLOP/s":
        return v * 1e15 / flops_per_token(run)
    if kind == "MFU":
        return v * gpus.get(run.gpu).bf16_flops * run.gpus / flops_per_token(run)
    raise ValueError(f"unknown figure kind {kind!r}")


def interval(run: Run, kind: str, text: str) -> tuple[float, float]:
    """Tokens/s range a printed figure allows, given its rounding (s/step runs the other way)."""
    lo, hi = (tokens_per_s(run, kind, value(text) + d * half_unit(text)) for d in (-1, 1))
    return min(lo, hi), max(lo, hi)


def _nar(row: str, model: Model, tp: int, pp: int, n: int, batch: int, tf: str, pct: str,
         pf: str) -> Run:
    return Run(f"megatron-{model.name}-{n}", f"{NARAYANAN}, Table 1, row {row}", "Megatron-LM",
               model, 2048, batch, "a100-80gb", "dgx-a100", n,
               Layout(tp, pp, n // (tp * pp), vp=None, zero=0, ckpt="full"),
               (("TFLOP/s/GPU", tf), ("MFU", pct), ("PFLOP/s", pf)), "narayanan-eq3", "fp16",
               "Selene (DGX A100 80GB, 8 HDR IB per node). Table 1 gives no micro-batch or "
               "schedule. zero=0: Megatron-LM of 2021 had no sharded optimizer (not in Table 1). "
               "ckpt=full: Eq. 3 counts the recompute pass. 'MFU' is Table 1's '% of peak'.")


def _dgxc(size: str, model: str, n: int, batch: int, tp: int, pp: int, cp: int, vp: int | None,
          ga: int, step: str, tps: str, mfu: str, kv: int | None = None) -> Run:
    return Run(f"nemo-{model}-{n}", f"{DGXC} llama3.1/README_{size}.md, table 'Llama 3.1 {size} "
               f"24.09 BF16', column '{n}x H100'", "NeMo 24.09 (Megatron-Core)", llama(model),
               8192, batch, "h100-80gb", "dgx-h100", n,
               Layout(tp, pp, n // (tp * pp * cp), cp, vp, 1, "none", 1, ga),
               (("s/step", step), ("tokens/s", tps), ("MFU", mfu)), "megatron", "bf16",
               f"DGX Cloud H100. zero=1, ckpt=none from llama3.1/llama3.1_{size}.yaml at the same "
               "commit (optim distributed_fused_adam with overlap_grad_sync/overlap_param_sync; "
               "activations_checkpoint_granularity: null; ub_tp_comm_overlap and overlap_p2p_comm on "
               "for 70B/405B). Throughput = the last of 50-100 steps.", kv)


def _meta(row: str, seq: int, n: int, dp: int, cp: int, per_dp: int, tf: str) -> Run:
    return Run(f"llama3-405b-{n}-cp{cp}", f"{LLAMA3}, row '{row}'", "Meta (4D: FSDP+TP+CP+PP)",
               llama("llama-3.1-405b"), seq, dp * per_dp, "h100-80gb", "h100-roce", n,
               Layout(8, 16, dp, cp, None, local_batch=per_dp), (("TFLOP/s/GPU", tf),),
               notes="TFLOP/s/GPU and the layout as Table 4 gives them (its BF16 MFU column, "
                     "38-43 %, is not held here). FLOP count assumed: the course's (the paper "
                     "gives none); attention not halved for the causal mask. Tokens/batch 16M = "
                     "dp x batch/dp x seq. Schedule, micro-batch, checkpointing not in Table 4.")


_TT_H100 = ("Grand Teton H100 96GB HBM2e at 500 W (not the course's 700 W H100 SXM), 400 Gb/s "
            "RDMA per GPU; seq 8192 from train_configs/*.toml at torchtitan 9dec370. ")

RUNS: tuple[Run, ...] = (
    _nar("1.7B", gpt("1.7", 24, 2304, 24), 1, 1, 32, 512, "137", "44%", "4.4"),
    _nar("18.4B", gpt("18.4", 40, 6144, 48), 8, 1, 256, 1024, "135", "43%", "34.6"),
    _nar("145.6B", gpt("145.6", 80, 12288, 96), 8, 8, 1536, 2304, "148", "47%", "227.1"),
    _nar("1008.0B", gpt("1008", 128, 25600, 160), 8, 64, 3072, 3072, "163", "52%", "502.0"),
    _dgxc("8b", "llama-3-8b", 8, 128, 1, 1, 2, 1, 32, "12.91", "81222", "59.37%"),
    _dgxc("8b", "llama-3-8b", 128, 2048, 1, 1, 2, 1, 32, "13.10", "1280704", "58.51%"),
    _dgxc("70b", "llama-3-70b", 64, 128, 4, 4, 2, 5, 64, "14.72", "71235", "54.10%"),
    _dgxc("70b", "llama-3-70b", 1024, 2048, 4, 4, 2, 5, 64, "14.92", "1124478", "53.38%"),
    _dgxc("405b", "llama-3.1-405b", 576, 252, 8, 9, 2, 7, 63, "17.20", "120022", "55.78%", 16),
    _dgxc("405b", "llama-3.1-405b", 2304, 1008, 8, 9, 2, 7, 63, "17.62", "468646", "54.45%", 16),
    Run("torchtitan-8b-a100-64", TITAN.format("157a12c562288b3bccb077003a97f18a4ca657aa") +
        ", table 'LLaMa 3 performance numbers', row '8B | selective op'", "torchtitan (FSDP2)",
        llama("llama-3-8b"), 8192, 64, "a100-80gb", "dgx-a100", 64,
        Layout(1, 1, 64, zero=3, ckpt="selective-op", micro_batch=1, accum=1, local_batch=1),
        (("tokens/s/GPU", "2973"), ("MFU", "58.2%")),
        notes="64 A100 80GB; the cluster's network is not stated (node type assumed). seq 8192 "
              "from train_configs/llama3_8b.toml at the same commit."),
    Run("torchtitan-70b-a100-64", TITAN.format("157a12c562288b3bccb077003a97f18a4ca657aa") +
        ", table 'LLaMa 3 performance numbers', row '70B | full'", "torchtitan (FSDP2)",
        llama("llama-3-70b"), 8192, 64, "a100-80gb", "dgx-a100", 64,
        Layout(1, 1, 64, zero=3, ckpt="full", micro_batch=1, accum=1, local_batch=1),
        (("tokens/s/GPU", "331"), ("MFU", "51.7%")),
        notes="64 A100 80GB, FSDP2 over all 64 (no TP); network not stated (node type assumed)."),
    Run("torchtitan-405b-h100-128", TITAN.format("3faaa1a0dee68ce028400e3dafd1735d152cb4f8") +
        ", table 'Llama 3.1 performance numbers', row '405B | 2 | full | 109' (no Float8)",
        "torchtitan (FSDP2+TP)", llama("llama-3.1-405b"), 8192, 32, "h100-80gb", "h100-roce", 128,
        Layout(8, 1, 16, zero=3, ckpt="full", micro_batch=2, accum=1, local_batch=2),
        (("tokens/s/GPU", "109"), ("MFU", "29.0%")),
        notes="H100 94-95GB HBM2e, lower TDP; MFU taken on the 989 TFLOP/s SXM peak (footnote 1)."),
    Run("torchtitan-8b-h100-8", TITAN.format("d4c86e3758a84cf23e2e879ab3c995cba9d5e410") +
        ", Table 1, row 'FSDP'", "torchtitan (FSDP2)", llama("llama-3-8b"), 8192, 16,
        "h100-80gb", "h100-roce", 8,
        Layout(1, 1, 8, zero=3, ckpt="selective-op", micro_batch=2, accum=1, local_batch=2),
        (("tokens/s/GPU", "5,762"),), notes=_TT_H100 + "No torch.compile, no Float8."),
    Run("torchtitan-8b-h100-128", TITAN.format("d4c86e3758a84cf23e2e879ab3c995cba9d5e410") +
        ", Table 3, row 'FSDP'", "torchtitan (FSDP2)", llama("llama-3-8b"), 8192, 256,
        "h100-80gb", "h100-roce", 128,
        Layout(1, 1, 128, zero=3, ckpt="selective-op", micro_batch=2, accum=1, local_batch=2),
        (("tokens/s/GPU", "5,605"),), notes=_TT_H100 + "No torch.compile, no Float8."),
    Run("torchtitan-70b-h100-256", TITAN.format("d4c86e3758a84cf23e2e879ab3c995cba9d5e410") +
        ", Table 4, row '2D'", "torchtitan (FSDP2+TP)", llama("llama-3-70b"), 8192, 512,
        "h100-80gb", "h100-roce", 256,
        Layout(8, 1, 32, zero=3, ckpt="full", micro_batch=16, accum=1, local_batch=16),
        (("tokens/s/GPU", "829"),), precision="fp8",
        notes=_TT_H100 + "torch.compile + Float8 linears (FP8): not a bf16 run."),
    Run("torchtitan-405b-h100-512", TITAN.format("d4c86e3758a84cf23e2e879ab3c995cba9d5e410") +
        ", Table 5, row 'Interleaved 1F1B'", "torchtitan (FSDP2+TP+PP)",
        llama("llama-3.1-405b"), 8192, 256, "h100-80gb", "h100-roce", 512,
        Layout(8, 8, 8, vp=None, zero=3, ckpt="full", local_batch=32),
        (("tokens/s/GPU", "128"),), precision="fp8",
        notes=_TT_H100 + "compile + Float8 + async TP (FP8); pipeline micro-batches and stages per "
              "rank not stated."),
    _meta("8,192 GPUs", 8192, 8192, 64, 1, 32, "430"),
    _meta("16,384 GPUs, CP 1", 8192, 16384, 128, 1, 16, "400"),
    _meta("16,384 GPUs, CP 16", 131072, 16384, 8, 16, 16, "380"),
)


def get(key: str) -> Run:
    """The run named ``key``; a :class:`UsageError` lists the keys."""
    runs = {r.key: r for r in RUNS}
    return runs[one_of(key, tuple(runs), "published run")]


def in_registry(run: Run) -> bool:
    """The course's registry describes the run's model exactly (every dimension)."""
    m = run.model
    return m.registry is not None and llama(m.registry) == m


def table() -> str:
    """One line per run (under 100 columns): key, GPUs, layout, batch, published, tokens/s."""
    head = f"{'case':<26}{'GPUs':>6}  {'layout':<22}{'batch':>6}  {'published':<17}"
    lines = [f"{head}{'tokens/s':>11}"]
    for r in RUNS:
        lay = r.layout
        short = f"tp{lay.tp} pp{lay.pp} dp{lay.dp}" + (f" cp{lay.cp}" if lay.cp > 1 else "")
        kind, text = r.published[0]
        lines.append(f"{r.key:<26}{r.gpus:>6}  {short:<22}{r.global_batch:>6}  "
                     f"{text + ' ' + kind:<17}{r.derived_tokens_per_s():>11,.0f}")
    return "\n".join(lines)
