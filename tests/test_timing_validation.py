"""The time engine against published training runs (issue 19, item 4).

The oracle is the published figure of each run (papers and benchmark tables, cited in
``gpumem/timing/published.py`` beside each run; their conversion to tokens/s is checked by hand in
``tests/test_timing_published.py``). Each run's own layout is priced by ``plan --layout`` with the
planner's defaults, one set of constants for every case. A case inside 0.85-1.15 must stay there;
a case the model misses must carry its reason and miss on the side the reason says: a compute
peak above the GPUs' real one over-predicts, an unmodelled schedule under-predicts. If a miss
moves into the band, the reason is stale and this test says so.
"""

import json
import subprocess
import sys
import time

import pytest

from gpumem.planner import validate
from gpumem.timing import published

OVER = {"torchtitan-405b-h100-128", "torchtitan-8b-h100-8", "torchtitan-8b-h100-128"}   # 500 W H100s
UNDER = set(validate.MISSES) - OVER                                                     # bubbles


@pytest.fixture(scope="module")
def rows():
    return {r.run.key: r for r in validate.rows()}


def test_every_published_run_is_priced_or_out_of_scope_with_a_reason(rows):
    assert set(rows) == {r.key for r in published.RUNS}
    for key, row in rows.items():
        if key in validate.OUT_OF_SCOPE:
            assert row.predicted is None and row.note
        else:
            assert row.predicted > 0 and row.ratio == pytest.approx(row.predicted / row.published)


def test_the_calibration_run_is_matched(rows):
    assert 0.95 <= rows[validate.CALIBRATION].ratio <= 1.05


@pytest.mark.parametrize("key", [r.key for r in published.RUNS if r.key not in validate.OUT_OF_SCOPE
                                 and r.key not in validate.MISSES and r.key != validate.CALIBRATION])
def test_predicted_within_band(rows, key):
    lo, hi = validate.BAND
    assert lo <= rows[key].ratio <= hi, (key, rows[key].ratio)


@pytest.mark.parametrize("key", sorted(validate.MISSES))
def test_each_miss_misses_on_the_side_its_reason_says(rows, key):
    r = rows[key].ratio
    if key in OVER:
        assert r > validate.BAND[1] and "500 W" in validate.MISSES[key]
    else:
        assert r < validate.BAND[0] and "bubble" in validate.MISSES[key]


def test_enough_cases_across_frameworks_and_scales(rows):
    scored = [r for r in rows.values() if r.ratio is not None and r.run.key != validate.CALIBRATION]
    inside = [r for r in scored if validate.BAND[0] <= r.ratio <= validate.BAND[1]]
    assert len(inside) >= 8
    assert len({r.run.framework.split(" ")[0] for r in inside}) >= 3       # Megatron-LM, NeMo, torchtitan
    assert min(r.run.gpus for r in inside) <= 64 and max(r.run.gpus for r in inside) >= 1024


def test_assumed_fields_are_named(rows):
    nemo = rows["nemo-llama-3-70b-64"]                 # every field from the benchmark's own YAML
    assert "cp=2" in nemo.layout and "vp=5" in nemo.layout and "zero=1" in nemo.layout
    assert not nemo.assumed and "yaml" in nemo.run.notes
    meta = rows["llama3-405b-8192-cp1"]                 # Table 4 gives no ZeRO stage, checkpointing or schedule
    assert {a.split(":")[0] for a in meta.assumed} >= {"zero=1", "ckpt=none", "vp=1"}
    assert any("SAC" in a for a in rows["torchtitan-8b-a100-64"].assumed)
    assert any(a.startswith("attn=naive") for a in rows["megatron-gpt-18.4b-256"].assumed)


def test_gpt_rows_have_the_papers_parameter_counts():
    """Narayanan et al. Eq. 2: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)), tied embeddings and
    learned positions; the course's description (a SwiGLU of width 8h/3, untied head) has the same
    per-layer weights, so it differs by the output head's V h, the positions' s h and the norms'
    and biases' few h per layer (Eq. 2's 13 h against RMSNorm's 2 h)."""
    for key in ("megatron-gpt-1.7b-32", "megatron-gpt-18.4b-256", "megatron-gpt-145.6b-1536",
                "megatron-gpt-1008b-3072"):
        run = published.get(key)
        m, s = run.model, run.seq
        L, h, V = m.layers, m.hidden, m.vocab
        eq2 = 12 * L * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * L * h))
        course = run.model.config().n_params() - V * h + s * h
        assert course == pytest.approx(eq2, rel=5e-4), key
        assert round(eq2 / 1e9, 1) == float(key.split("-")[2].rstrip("b")), key


def test_table_fits_the_page(rows):
    text = validate.table(list(rows.values()))
    assert max(map(len, text.splitlines())) <= 100
    assert "calibration" in text and "out of scope" in text


def test_plan_layout_json_prices_context_and_virtual_stages():
    run = published.get("nemo-llama-3-70b-64")
    arg, _ = validate.layout_arg(run)
    cmd = [sys.executable, "-m", "gpumem", "plan", "--model", "llama-3-70b", "--gpus", "64", "--seq", "8192",
           "--global-batch", "128", "--layout", arg, "--json"]
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t
    res = json.loads(out.stdout)["layout_result"]
    assert res["fits"] and res["framework"] == "megatron-core"
    assert res["layout"]["cp"] == 2 and res["layout"]["vp"] == 5
    assert res["tokens_per_s"] == pytest.approx(validate.price(run).predicted, rel=1e-9)
    assert wall < 10      # a subprocess start included (the search alone: `make bench`)
