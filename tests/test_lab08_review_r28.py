"""Lab 08, review r28: the nested map seen per tensor (cell 3) and named when counted once; row hints
that name the moment or group that is wrong, not its terms; cell 17's re-run compute by rung; the
tracers refused by name.

Hand counts: Llama-3-8B's quantised tensors are its 7 projections x 32 layers; a map counted once
is short by its bytes (256 fp32 values, bitsandbytes' ``name2qmap["dynamic"]``) x (tensors - 1).
"""

import json
import os
import random

import pytest

from conftest import ROOT
from gpumem.chapters.ch08_finetuning import lab_draw
from test_lab08_adversarial import LAB, LLAMA3_8B, first_problem, grade, solution


@pytest.fixture(autouse=True)
def _tests_count_as_cells(monkeypatch):
    """This file's learners' functions, and test_lab08_adversarial's (walk), count as cells while graded."""
    import test_lab08_adversarial
    cells = (__file__, test_lab08_adversarial.__file__, "<cheat cell>", "<string>")
    monkeypatch.setenv("GPUMEM_TEST_CELLS", os.pathsep.join(cells))


def _cells(folder: str) -> list[dict]:
    return json.loads((ROOT / folder / f"{LAB}.ipynb").read_text())["cells"]


def _nf4_cell(folder: str) -> dict:
    return next(c for c in _cells(folder) if c["cell_type"] == "code" and "quantize_4bit(" in "".join(c["source"]))


def test_cell_3_quantises_two_weights_and_shows_whether_their_maps_share_storage():
    """Finding 1: one weight could not show whether state2.code is shared; the cell now quantises two
    and prints whether each map is in the same storage (data_ptr), in the lab and its solution,
    without stating the bytes; its stored output says what bitsandbytes does, checked here too."""
    for folder in ("solutions", "labs"):
        cell = _nf4_cell(folder)
        source = "".join(cell["source"])
        assert "for t in (w, w2)" in source and "data_ptr()" in source, source
        assert "1,024" not in source and "KiB" not in source and "own copy" not in source, source
    out = "".join("".join(o.get("text", "")) for o in _nf4_cell("solutions")["outputs"])
    assert "same storage as w2's (data_ptr): code False, state2.code False" in out, out
    import bitsandbytes.functional as bnbf
    import torch
    (_, a), (_, b) = (bnbf.quantize_4bit(torch.randn(n, 64, dtype=torch.bfloat16), blocksize=64,
                                         compress_statistics=True, quant_type="nf4") for n in (64, 128))
    assert a.state2.code.data_ptr() != b.state2.code.data_ptr() and a.state2.code.numel() == 256


def test_the_nested_map_counted_once_is_named_without_its_bytes():
    """Finding 1: quant_constants short by one nested map per quantised tensor but one (Llama-3-8B:
    224 tensors, by hand) names the per-tensor copy and gives no number; a different gap does not."""
    from gpumem.chapters.ch08_finetuning import labcheck
    from gpumem.memory import models
    ft = lab_draw.LADDER["qlora"]
    assert ft.double_quant
    want = lab_draw.truth(models.get("llama-3-8b"), ft)
    got = dict(want, quant_constants=want["quant_constants"] - 256 * 4 * (7 * 32 - 1))
    said = labcheck.states_problem(got, want, ft, LLAMA3_8B)
    assert "quant_constants" in said and "its own copy of the nested map" in said, said
    assert not any(n in said for n in ("1,024", "1024", "KiB", "256")), said
    got = dict(want, quant_constants=want["quant_constants"] - 256 * 4 * (7 * 32 - 2))
    assert "nested map" not in labcheck.states_problem(got, want, ft, LLAMA3_8B)


def test_a_role_bytes_that_counts_the_nested_map_once_fails_each_row_naming_it():
    """Finding 1 (review r28's -mistakes2): the solution with the nested map counted once, as 8-bit
    AdamW's shared maps are; every role_bytes row (each has a double-quantised QLoRA setup) names it."""
    ns = solution()
    right = ns["role_bytes"]

    def once(model, ft):
        got = right(model, ft)
        if ft.base_dtype == "nf4" and ft.double_quant:
            got["quant_constants"] -= 256 * 4 * (7 * model["n_layers"] - 1)
        return got
    ns["role_bytes"] = once
    rows = [r for r in grade(ns, 3).rows if r.function == "role_bytes"]
    assert len(rows) == 3 and all(r.status == "wrong" and "its own copy of the nested map" in r.detail
                                  for r in rows), [r.detail for r in rows]


def test_the_8bit_hint_names_the_group_not_the_rule():
    """Finding 2: full 8-bit AdamW's moments wrong: the row points at the tensors init_state leaves
    unquantised, without their size rule or their states."""
    from gpumem.chapters.ch08_finetuning import labcheck
    from gpumem.memory import models
    ft = lab_draw.LADDER["full-8bit"]
    want = lab_draw.truth(models.get("llama-3-8b"), ft)
    said = labcheck.states_problem(dict(want, optimizer_moments=want["optimizer_moments"] - 6 * 4096), want, ft)
    assert "optimizer_moments" in said and "leaves unquantised" in said and "init_state" in said, said
    assert "4,096" not in said and "fp32" not in said and "two" not in said, said


def test_the_checkpointed_fallback_hint_names_the_moments_not_their_terms():
    """Finding 2: a checkpointed peak off by no known piece names the two moments, not what each holds
    (review r31 #4: where it is the other moment's count; a count of neither gets no such hint)."""
    from gpumem.chapters.ch08_finetuning import lab_acts, lab_parts
    ft, seq = lab_draw.LADDER["full"], 512
    parts = lab_acts.peak_parts(lab_draw.config(LLAMA3_8B), ft, seq, 1, "full", 0.0)
    assert parts["recompute_peak"] < parts["forward_peak"] == parts["peak"]
    said = lab_parts._acts_hint(ft, "full", parts["recompute_peak"], parts, LLAMA3_8B, seq, 1)
    assert "end of the forward" in said and "re-run" in said, said
    assert "RoPE" not in said and "loss" not in said and "bf16 input" not in said, said


def test_cell_17_prices_the_re_run_per_rung_as_the_library_counts_it():
    """Finding 4: every layer checkpointed costs a third more compute for full fine-tuning (6 -> 8 N T)
    but half more with adapters (4 -> 6 N T, chapter 08 section 5); the cell says both, and the
    library's step FLOPs agree (adapters' own 6 n_a T keep LoRA just under 1.5)."""
    from gpumem.memory import models
    from gpumem.timing import finetune_time
    text = next("".join(c["source"]) for c in _cells("solutions") if "## 4 · The most faithful" in "".join(c["source"]))
    flat = " ".join(text.split())
    assert "a third more compute per step for full fine-tuning" in flat and "half more with adapters" in flat, flat
    assert "chapter 08 section 5" in flat
    cfg, T = models.get("llama-3-8b"), 4096
    for rung, ratio in (("full", 4 / 3), ("lora", 1.5), ("qlora", 1.5)):
        ft = lab_draw.LADDER[rung]
        more = finetune_time.lora_flops(cfg, ft, T, True) / finetune_time.lora_flops(cfg, ft, T, False)
        assert abs(more - ratio) < 0.01, (rung, more)


_SMALL = {"n_layers": 2, "d_model": 256, "n_heads": 4, "n_kv_heads": 2, "head_dim": 64, "ffn": 512,
          "vocab": 512, "tie_embeddings": False}
_RAW = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16,
        "num_key_value_heads": 2, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 256,
        "hidden_act": "silu", "max_position_embeddings": 64, "tie_word_embeddings": False}


def _tracer_calls():
    from gpumem.memory import finetune_build, lora_trace, timeline, tracing
    cfg = lambda: lab_draw.config(_SMALL)      # noqa: E731
    lora = lab_draw.LADDER["lora"]
    return {"gpumem.memory.tracer.trace_step": lambda: tracing.trace_step(cfg(), "mixed", "flash", "none", 16, 1),
            "gpumem.memory.trace_compose.trace_fast": lambda: tracing.trace_fast(cfg(), "mixed", "flash", "none", 16),
            "gpumem.memory.timeline.record": lambda: timeline.record(cfg(), "mixed", "flash", "none", 16),
            "gpumem.memory.timeline.recorded": lambda: timeline.recorded(cfg(), "mixed", "flash", "none", 16),
            "gpumem.memory.lora_trace.trace_ft": lambda: lora_trace.trace_ft(_RAW, lora, 16),
            "gpumem.memory.finetune_build.build_ft": lambda: finetune_build.build_ft(_RAW, lora, fake=True)}


@pytest.mark.parametrize("name", ["gpumem.memory.tracer.trace_step", "gpumem.memory.trace_compose.trace_fast",
                                  "gpumem.memory.timeline.record", "gpumem.memory.timeline.recorded",
                                  "gpumem.memory.lora_trace.trace_ft", "gpumem.memory.finetune_build.build_ft"])
def test_the_tracers_are_refused_by_name(name):
    """Finding 5: gpumem's tracers measure a step's peak and states (review r28: trace_step matched
    finetune_activation_bytes to the byte, run unguarded); a learner's function that calls one is
    refused by the library block, naming it, not by the frame rule that torch's stack walk trips."""
    from gpumem.chapters.ch08_finetuning import lab_guard
    run = _tracer_calls()[name]
    lab_guard.refresh()

    def activation_peak(*args):       # the learner's function: it measures instead of counting
        run()
        return 0
    with pytest.raises(RuntimeError) as refused:
        lab_guard.guarded(activation_peak)()
    assert f"(it called {name})" in str(refused.value), str(refused.value)


def test_a_learner_who_traces_the_peak_fails_its_row_naming_the_tracer():
    """Finding 5, through the grader: an activation_peak that returns trace_step's peak for full
    fine-tuning fails its rows, each naming gpumem.memory.tracer.trace_step."""
    from gpumem.memory import tracing
    ns = solution()
    right = ns["activation_peak"]

    def activation_peak(model, ft, seq, batch, policy, dropout=0.0):
        if ft.lora:
            return right(model, ft, seq, batch, policy, dropout)
        return tracing.trace_step(lab_draw.config(model), "mixed", "flash", policy, seq, batch).peaks["total"]
    ns["activation_peak"] = activation_peak
    row = first_problem(grade(ns, random.Random(0).randrange(100)), "activation_peak")
    assert "count it yourself" in row.detail and "gpumem.memory.tracer.trace_step" in row.detail, row.detail


def _nested_map_once(ns: dict):
    right = ns["role_bytes"]

    def role_bytes(model, ft):        # review r28's -mistakes2 slip: 1 KiB a quantised tensor, but one
        got = right(model, ft)
        if ft.base_dtype == "nf4" and ft.double_quant:
            got["quant_constants"] -= 256 * 4 * (7 * model["n_layers"] - 1)
        return got
    return role_bytes


def test_a_count_slip_that_cannot_change_the_answer_is_not_blamed_for_the_choice():
    """Finding 6: the nested map counted once (KiBs) and a 1 GB reserve: the choose_recipe rows that
    fail name the reserve (or the policy), not "your role_bytes is wrong ... fix that first", since
    the learner's counts in the grader's place choose as the grader does."""
    from test_lab08_adversarial import walk
    wrong = []
    for seed in (0, 1, 2):
        ns = solution()
        ns["role_bytes"] = _nested_map_once(ns)
        ns["choose_recipe"] = walk(ns, lambda capacity: capacity - 10**9 - int(0.05 * capacity))
        report = grade(ns, seed)
        assert any(r.function == "role_bytes" and r.status == "wrong" for r in report.rows), report.summary()
        wrong += [r.detail for r in report.rows if r.function == "choose_recipe" and r.status != "ok"]
    assert wrong and all(d.startswith(("qlora", "lora", "full", "None")) for d in wrong), wrong   # why_not's rows
    assert any("reserve" in d for d in wrong) and not any("fix that first" in d for d in wrong), wrong


def test_a_count_slip_that_changes_the_answer_is_still_named_first():
    """Finding 6, the other side: states counted twice over by role_bytes, and a chooser that walks the
    ladder with them (the right reserve): every choose_recipe row that fails starts with role_bytes."""
    from test_lab08_adversarial import walk
    ns = solution()
    right = ns["role_bytes"]
    ns["role_bytes"] = lambda model, ft: {k: 2 * v for k, v in right(model, ft).items()}
    ns["choose_recipe"] = walk(ns)
    wrong = [r.detail for r in grade(ns, 0).rows if r.function == "choose_recipe" and r.status != "ok"]
    assert wrong and all(d.startswith("your role_bytes is wrong (see its rows): fix that first; ") for d in wrong), wrong
