"""The published runs the time engine is validated against (gpumem/timing/published.py).

The oracles are the sources' own numbers: a paper's two figures for one run must agree through
the conversion within their printed rounding, layouts must multiply out to the GPU count, and
batches to dp x micro-batch x accumulation. Parameter and FLOP counts are hand-counted here from
the papers' formulas, not taken from the module.
"""

import re
from dataclasses import replace

import pytest

from gpumem.memory import gpus
from gpumem.timing import published as P

RUNS = {r.key: r for r in P.RUNS}


def overlap(a, b, slack=0.0):
    return a[0] <= b[1] * (1 + slack) and b[0] <= a[1] * (1 + slack)


# -- every run ---------------------------------------------------------------------------------

def test_enough_runs_scales_and_frameworks():
    assert len(P.RUNS) >= 10 and len(RUNS) == len(P.RUNS)
    families = {r.framework.split(" ")[0] for r in P.RUNS}
    assert {"Megatron-LM", "NeMo", "torchtitan", "Meta"} <= families
    sizes = [r.gpus for r in P.RUNS]
    assert min(sizes) <= 8 and max(sizes) >= 8192


@pytest.mark.parametrize("run", P.RUNS, ids=lambda r: r.key)
def test_layout_multiplies_out_to_the_gpus(run):
    lay = run.layout
    assert lay.tp * lay.pp * lay.dp * lay.cp == run.gpus
    assert run.model.hidden % run.model.heads == 0 and run.model.heads % lay.tp == 0


@pytest.mark.parametrize("run", P.RUNS, ids=lambda r: r.key)
def test_global_batch_is_dp_times_micro_batch_times_accumulation(run):
    lay = run.layout
    if lay.micro_batch is not None and lay.accum is not None:
        assert run.global_batch == lay.dp * lay.micro_batch * lay.accum
    if lay.local_batch is not None:
        assert run.global_batch == lay.dp * lay.local_batch


@pytest.mark.parametrize("run", P.RUNS, ids=lambda r: r.key)
def test_every_run_names_a_source_precise_enough_to_find(run):
    assert re.search(r"\b(Table \d+|table '[^']+')", run.source), run.source
    assert re.search(r"arXiv:\d{4}\.\d{5}|@[0-9a-f]{40}\b", run.source), run.source
    assert run.published and all(k in ("tokens/s", "tokens/s/GPU", "s/step", "TFLOP/s/GPU",
                                       "PFLOP/s", "MFU") for k, _ in run.published)
    assert run.gpu in gpus.REGISTRY and run.precision in ("bf16", "fp16", "fp8")


@pytest.mark.parametrize("run", P.RUNS, ids=lambda r: r.key)
def test_a_runs_figures_agree_through_the_conversion(run):
    """Each pair of printed figures implies overlapping tokens/s ranges. NVIDIA's MFU uses a
    model-FLOP constant printed to 3 figures ("4.74E+14" for 4.744E+14) and takes the MFU from
    an unrounded step time: 0.2 % more slack there (the gaps found are up to 0.13 %)."""
    slack = 0.002 if run.flops == "megatron" else 0.0
    ranges = [P.interval(run, k, t) for k, t in run.published]
    for a in ranges:
        for b in ranges:
            assert overlap(a, b, slack), (run.key, ranges)
    lo, hi = ranges[0]
    assert lo <= run.derived_tokens_per_s() <= hi


def test_which_runs_the_registry_describes_exactly():
    exact = {k for k, r in RUNS.items() if P.in_registry(r)}
    assert exact == {k for k in RUNS if not k.startswith("megatron-gpt")}
    hand = {"llama-3-8b": (32, 4096, 32, 8, 14336), "llama-3-70b": (80, 8192, 64, 8, 28672),
            "llama-3.1-405b": (126, 16384, 128, 8, 53248)}   # arXiv:2407.21783 Table 3
    for r in P.RUNS:
        if r.model.registry:
            m = r.model
            assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn) == hand[m.registry]
            assert m.vocab == 128256


def test_layout_arg_leaves_unknowns_out():
    assert RUNS["nemo-llama-3-70b-64"].layout.arg() == "tp=4,pp=4,dp=2,zero=1,ckpt=none,mb=1,vp=5,cp=2"
    assert RUNS["llama3-405b-8192-cp1"].layout.arg() == "tp=8,pp=16,dp=64,cp=1"      # Table 4: no more
    assert RUNS["torchtitan-8b-h100-8"].layout.arg() == \
        "tp=1,pp=1,dp=8,zero=3,ckpt=selective-op,mb=2,vp=1,cp=1"


def test_printed_figures_parse_with_their_rounding():
    assert P.value("5,762") == 5762 and P.value("44%") == 0.44 and P.value("59.37%") == 0.5937
    assert P.half_unit("44%") == pytest.approx(0.005) and P.half_unit("17.20") == 0.005
    assert P.half_unit("1280704") == 0.5


def test_table_fits_100_columns():
    text = P.table()
    assert len(text.splitlines()) == len(P.RUNS) + 1
    assert max(map(len, text.splitlines())) <= 100


# -- Narayanan et al. 2021, Table 1 --------------------------------------------------------------

PARAMS_B = {"megatron-gpt-1.7b-32": 1.7, "megatron-gpt-18.4b-256": 18.4,
            "megatron-gpt-145.6b-1536": 145.6, "megatron-gpt-1008b-3072": 1008.0}


@pytest.mark.parametrize("key", PARAMS_B)
def test_narayanan_rows_dimensions_give_the_params_column(key):
    """Eq. 2: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)), V = 51,200, s = 2,048."""
    m = RUNS[key].model
    l, h = m.layers, m.hidden
    p = 12 * l * h * h * (1 + 13 / (12 * h) + (51200 + 2048) / (12 * l * h)) / 1e9
    assert abs(p - PARAMS_B[key]) <= 0.05, p           # the column has one decimal


@pytest.mark.parametrize("key", PARAMS_B)
def test_narayanan_tflops_percent_of_peak_and_aggregate_agree(key):
    """Hand check of Table 1: achieved TF/s over 312 TF/s (A100) is the '% of peak' column, and
    times the GPUs it is the aggregate PF/s column, each within its printed rounding."""
    r = RUNS[key]
    tf, pct, pf = (P.value(r.figure(k)) for k in ("TFLOP/s/GPU", "MFU", "PFLOP/s"))
    assert gpus.get(r.gpu).bf16_flops == 312e12
    assert overlap(((tf - 0.5) / 312, (tf + 0.5) / 312), (pct - 0.005, pct + 0.005))
    assert (tf - 0.5) * r.gpus / 1000 <= pf + 0.05 and pf - 0.05 <= (tf + 0.5) * r.gpus / 1000


def test_narayanan_1t_tokens_per_second_by_hand():
    """502.0 PF/s over Eq. 3's FLOPs per token (96 l h^2 (1 + s/6h + V/16lh)) at l = 128,
    h = 25,600: about 61,500 tokens/s, so a 3,072 x 2,048-token step takes about 102 s."""
    r = RUNS["megatron-gpt-1008b-3072"]
    per_token = 96 * 128 * 25600 ** 2 * (1 + 2048 / (6 * 25600) + 51200 / (16 * 128 * 25600))
    assert 502.0e15 / per_token == pytest.approx(61457, rel=1e-3)
    assert r.derived_tokens_per_s() == pytest.approx(61457, rel=4e-3)   # from "163" TF/s
    assert 3072 * 2048 / r.derived_tokens_per_s() == pytest.approx(102.6, abs=0.5)


# -- NVIDIA dgxc-benchmarking (NeMo 24.09), llama3.1/README_*.md -------------------------------

# "The model flops for Llama 3.1 <size> for GBS=1 is ..." (each README, "Expected Performance")
README_MODEL_FLOPS = {"llama-3-8b": 4.74e14, "llama-3-70b": 3.94e15, "llama-3.1-405b": 2.17e16}
NEMO = [k for k in RUNS if k.startswith("nemo-")]


@pytest.mark.parametrize("key", NEMO)
def test_nemo_megatron_flop_count_is_the_readmes(key):
    r = RUNS[key]
    per_seq = P.flops_per_token(r) * r.seq
    assert f"{per_seq:.2e}" == f"{README_MODEL_FLOPS[r.model.registry]:.2e}"  # 3 figures


def test_nemo_405b_readme_counted_16_query_groups():
    """The README's 2.17E+16 needs 16 query groups (its Notes: '1 + 16/128'); the model has 8,
    which would print 2.15E+16. The run keeps the README's count for its MFU cross-check."""
    r = RUNS["nemo-llama-3.1-405b-576"]
    assert r.model.kv_heads == 8 and r.flop_kv_heads == 16
    eight = P.flops_per_token(replace(r, flop_kv_heads=None)) * r.seq
    assert round(eight / 1e16, 2) == 2.15 and round(P.flops_per_token(r) * r.seq / 1e16, 2) == 2.17


@pytest.mark.parametrize("key", NEMO)
def test_nemo_step_time_tokens_and_mfu_by_hand(key):
    """seq x GBS / step = the tokens/s column; GBS x model flops / step / GPUs / 989 TF = MFU."""
    r = RUNS[key]
    step, tps, mfu = (P.value(r.figure(k)) for k in ("s/step", "tokens/s", "MFU"))
    assert 8192 * r.global_batch / (step + 0.005) <= tps + 0.5
    assert tps - 0.5 <= 8192 * r.global_batch / (step - 0.005)
    flops = README_MODEL_FLOPS[r.model.registry]
    assert r.global_batch * flops / step / r.gpus / 989e12 == pytest.approx(mfu, abs=6e-4)


def test_nemo_70b_2048_gpu_column_is_inconsistent_so_1024_is_used():
    """README_70b's 2048-GPU column prints 14.98 s but 2,248,957 tokens/s and 53.38 % MFU, the
    1024-GPU column's figures doubled/repeated (8192 x 2048 / 14.92 = 1,124,478). The check
    above rejects it; the 1024-GPU column passes."""
    bad = replace(RUNS["nemo-llama-3-70b-1024"], gpus=2048, global_batch=4096,
                  published=(("s/step", "14.98"), ("tokens/s", "2248957")))
    a, b = (P.interval(bad, k, t) for k, t in bad.published)
    assert not overlap(a, b, 0.002)


# -- torchtitan docs/performance.md -----------------------------------------------------------

def hand_params(L, d, a, kv, F, V):
    """Every parameter, as torchtitan's get_num_params counts them: embedding, untied output,
    per layer W_q, W_k, W_v, W_o, three SwiGLU matrices, two RMSNorm weights; final norm."""
    kvd = kv * d // a
    return 2 * V * d + L * (2 * d * d + 2 * d * kvd + 3 * d * F + 2 * d) + d


@pytest.mark.parametrize("key,dims", [
    ("torchtitan-8b-a100-64", (32, 4096, 32, 8, 14336, 128256)),
    ("torchtitan-70b-a100-64", (80, 8192, 64, 8, 28672, 128256)),
    ("torchtitan-405b-h100-128", (126, 16384, 128, 8, 53248, 128256))])
def test_torchtitan_wps_and_mfu_agree_by_its_own_formula(key, dims):
    """torchtitan's MFU = WPS x (6 N + 12 l h q t) / peak (torchtitan/utils.py at 157a12c,
    peak 312 TF A100, 989 TF H100 SXM), the same count as the course's."""
    r = RUNS[key]
    L, d = dims[0], dims[1]
    per_token = 6 * hand_params(*dims) + 12 * L * d * 8192
    assert P.flops_per_token(r) == per_token
    wps, mfu = P.value(r.figure("tokens/s/GPU")), P.value(r.figure("MFU"))
    peak = {"a100-80gb": 312e12, "h100-80gb": 989e12}[r.gpu]
    assert gpus.get(r.gpu).bf16_flops == peak
    lo, hi = (wps - 0.5) * per_token / peak, (wps + 0.5) * per_token / peak
    assert lo <= mfu + 0.0005 and mfu - 0.0005 <= hi


def test_torchtitan_global_batch_is_local_times_fsdp_ranks():
    """'global batch size = local batch size x number of FSDP ranks' (performance.md)."""
    stated = {"torchtitan-8b-a100-64": (1, 64, 64), "torchtitan-405b-h100-128": (2, 16, 32),
              "torchtitan-8b-h100-8": (2, 8, 16), "torchtitan-8b-h100-128": (2, 128, 256),
              "torchtitan-70b-h100-256": (16, 32, 512), "torchtitan-405b-h100-512": (32, 8, 256)}
    for key, (local, fsdp, glob) in stated.items():
        r = RUNS[key]
        assert (r.layout.local_batch, r.layout.dp, r.global_batch) == (local, fsdp, glob)


# -- Llama 3, Table 4 ---------------------------------------------------------------------------

LLAMA3 = [k for k in RUNS if k.startswith("llama3-")]


@pytest.mark.parametrize("key", LLAMA3)
def test_llama3_tokens_per_batch_is_16m(key):
    r = RUNS[key]
    assert r.layout.dp * r.layout.local_batch * r.seq == 16 * 2 ** 20 == r.global_batch * r.seq


@pytest.mark.parametrize("key", LLAMA3)
def test_llama3_tflops_within_the_papers_mfu_range(key):
    """The paper's BF16 MFU for these rows spans 38-43 %: TFLOP/s over 989 TF lands there."""
    tf = P.value(RUNS[key].figure("TFLOP/s/GPU"))
    assert 0.375 <= tf / 989 <= 0.435


def test_get_names_the_accepted_keys():
    from gpumem.errors import UsageError
    assert P.get("nemo-llama-3-8b-8").gpus == 8
    with pytest.raises(UsageError, match="llama3-405b-8192-cp1"):
        P.get("llama-405b")
