"""Lab 08, review r31: part 3's fallback hints name the group that is wrong, as questions, not the
rules cell 13 withholds; "fix that first" only where the learner's own count is wrong for the case;
choose_recipe's row says only the gap after a count named first; activation_peak's two-moments hint
only where one moment is right; a hint for NF4 on every tensor; the tracers listed by name; cells 8
and 9's tiny layer with widths that do not collide.

The slips are the review's mistake notebooks (/tmp/r31/lab08/-mistakes1/2/3), written here on the
solution's functions; the bytes they move are counted by hand from the model's dimensions.
"""

import os
import random

import pytest

from gpumem.chapters.ch08_finetuning import lab_acts, lab_draw
from test_lab08_adversarial import grade, solution


@pytest.fixture(autouse=True)
def _tests_count_as_cells(monkeypatch):
    """This file's learners' functions, and test_lab08_adversarial's, count as cells while graded."""
    import test_lab08_adversarial
    cells = (__file__, test_lab08_adversarial.__file__, "<cheat cell>", "<string>")
    monkeypatch.setenv("GPUMEM_TEST_CELLS", os.pathsep.join(cells))


def _adapters(model: dict, ft) -> int:
    """One block's adapter parameters, by hand: r x (in + out) per adapted projection."""
    h, q, kv, F = (model["d_model"], model["n_heads"] * model["head_dim"], model["n_kv_heads"] * model["head_dim"],
                   model["ffn"])
    shape = {"q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h), "gate": (h, F), "up": (h, F), "down": (F, h)}
    return sum(ft.lora_rank * sum(shape[t]) for t in ft.lora_targets)


def _offload_rows(ns: dict, seeds=(0, 1)) -> list[str]:
    return [r.detail for s in seeds for r in grade(ns, s).rows if r.function == "base_on_cpu" and r.status != "ok"]


# the words of the rules cell 13 asks for: a fallback row must not say them
_RULES = ("quant_constants", "dequant_buffer", "twice", "once", "two blocks", "two bf16 norms", "root unit once",
          "every role", "adapters' gradients", "NF4 constants", "dequantised matrix", "keeps the activations")


def test_a_pcie_copy_without_its_adapters_asks_what_a_block_holds():
    """Finding 1 (-mistakes1): each block's copy counted as its matrices and one norm, no adapters; the
    pcie row asks what else a block's copy holds and states no rule."""
    ns = solution()
    right = ns["base_on_cpu"]

    def base_on_cpu(model, ft, seq, batch, policy):
        got = right(model, ft, seq, batch, policy)
        e = 4 if ft.adapter_dtype == "fp32" else 2
        short = 2 * model["n_layers"] * (e * _adapters(model, ft) + 2 * model["d_model"])
        return got | {"pcie": got["pcie"] - short}
    ns["base_on_cpu"] = base_on_cpu
    rows = _offload_rows(ns)
    assert rows and all(", pcie: " in d and "a block's copy holds more than its matrices" in d and d.endswith("?")
                        for d in rows), rows
    assert not any(w in d for d in rows for w in _RULES), rows


def test_the_root_counted_twice_asks_how_long_it_stays_gathered():
    """Finding 1 (-mistakes2): the root unit (bf16 embedding, head unless tied, final norm, by hand)
    crossing twice; the row asks how long it stays gathered."""
    ns = solution()
    right = ns["base_on_cpu"]

    def base_on_cpu(model, ft, seq, batch, policy):
        got = right(model, ft, seq, batch, policy)
        h, V = model["d_model"], model["vocab"]
        root = 2 * (V * h * (1 if model["tie_embeddings"] else 2) + h)
        return got | {"pcie": got["pcie"] + root}
    ns["base_on_cpu"] = base_on_cpu
    rows = _offload_rows(ns)
    assert rows and all(", pcie: " in d and "how long does it stay gathered?" in d for d in rows), rows
    assert not any(w in d for d in rows for w in _RULES), rows


def test_a_host_that_keeps_every_role_asks_which_are_fsdp_parameters():
    """Finding 1: QLoRA's host counted as every role of role_bytes; the row asks which roles are FSDP
    parameters, without naming the two that stay."""
    ns = solution()
    right, roles = ns["base_on_cpu"], ns["role_bytes"]
    ns["base_on_cpu"] = lambda model, ft, seq, batch, policy: right(model, ft, seq, batch, policy) | {
        "host": sum(roles(model, ft).values())}
    rows = _offload_rows(ns)
    assert rows and all(d.startswith("QLoRA") and ", host: " in d and "which roles are FSDP parameters?" in d
                        for d in rows), rows
    assert not any(w in d for d in rows for w in _RULES), rows


@pytest.mark.parametrize("key", ["host", "pcie", "gpu"], ids=["host-row", "pcie-row", "gpu-row"])  # "gpu" alone: a GPU mark
def test_an_unknown_slip_gets_the_direction_and_factor_only(key):
    """Finding 1: a count off by no known group (a tenth too high) gets no hint: the row's own words
    are the direction and the factor, no rule."""
    from gpumem.chapters.ch08_finetuning import lab_parts
    for model, _, _, setups in lab_acts.offload_cases(random.Random(5)):
        for ft, _, want in setups:
            assert lab_parts._offload_hint(key, want[key] * 11 // 10, want, ft, model) == ""


def test_the_gpu_row_blames_activation_peak_only_where_it_is_wrong_for_that_setup():
    """Finding 2 (-mistakes3): activation_peak wrong only when checkpointed, base_on_cpu's gpu off by
    12,345 B in every setup: a gpu row without checkpointing is not blamed on activation_peak (its
    count there is right); a checkpointed one is."""
    ns = solution()
    acts, cpu = ns["activation_peak"], ns["base_on_cpu"]

    def activation_peak(model, ft, seq, batch, policy, dropout=0.0):
        return acts(model, ft, seq, batch, policy, dropout) + (1_000 if policy == "full" else 0)

    def base_on_cpu(model, ft, seq, batch, policy):
        got = cpu(model, ft, seq, batch, policy)
        return got | {"gpu": got["gpu"] + 12_345}
    ns.update(activation_peak=activation_peak, base_on_cpu=base_on_cpu)
    rows = _offload_rows(ns, (0, 1, 2))
    plain = [d for d in rows if "no checkpointing, gpu: " in d]
    checkpointed = [d for d in rows if "every layer checkpointed, gpu: " in d]
    assert plain and checkpointed and len(plain) + len(checkpointed) == len(rows), rows
    assert not any("fix that first" in d for d in plain), plain
    assert all("your activation_peak is wrong (see its rows): fix that first; " in d for d in checkpointed), checkpointed


def test_a_count_named_first_is_followed_by_where_the_setup_stands_only():
    """Finding 3 (-mistakes1): NF4 on every tensor shrinks role_bytes' QLoRA base_weights (here to
    half), and the chooser walks the ladder with it; each choose_recipe row names role_bytes first,
    then one line of where the setup stands, with no diagnosis after it (it blamed quant_constants,
    which were right, or the reserve)."""
    from test_lab08_adversarial import walk
    ns = solution()
    right = ns["role_bytes"]

    def role_bytes(model, ft):
        r = right(model, ft)
        return r | {"base_weights": r["base_weights"] // 2} if ft.base_dtype == "nf4" else r
    ns.update(role_bytes=role_bytes)
    ns["choose_recipe"] = walk(ns)
    prefix = "your role_bytes is wrong (see its rows): fix that first; "
    rows = [r.detail for s in (0, 1) for r in grade(ns, s).rows if r.function == "choose_recipe" and r.status != "ok"]
    assert rows and all(d.startswith(prefix) for d in rows), rows
    for d in rows:
        rest = d[len(prefix):]
        assert " -- " not in rest and "?" not in rest and ";" not in rest, d
        assert not any(w in rest for w in ("quant_constants", "reserve", "absmax", "dequant", "chooser")), d
        assert " GB usable" in rest, d


def test_full_fine_tuning_with_inputs_counted_twice_asks_which_are_saved_already():
    """Finding 4 (-mistakes1): full fine-tuning with o's and down's inputs saved again, by hand one bf16
    copy each, 2 T (n_heads x head_dim + ffn) B a layer (every layer's without checkpointing, the
    re-run layer's with it): each row that fails is a full fine-tuning one and asks which
    projections read a tensor already saved, not about the two moments. The slip is in the
    solution's source (review r33 #3: the copies are in a layer's saves, so a checkpointed forward's
    end does not hold them; adding them to that moment too was no slip a learner makes). Where
    q + F = 4h the re-run's bytes are also its two norms counted as the trace's plain ones: the row
    asks about those first, then this question."""
    import json

    from conftest import ROOT
    from test_lab08_adversarial import LAB
    ns = dict(solution())
    cells = json.loads((ROOT / "solutions" / f"{LAB}.ipynb").read_text())["cells"]
    src = next("".join(c["source"]) for c in cells if "def activation_peak(" in "".join(c["source"]))
    old = "layer = first = T * (2 * norm + 2 * h + core + 2 * h + 4 * 2 * F)"
    assert src.count(old) == 1
    exec(compile(src.replace(old, old[:-1] + " + 2 * q + 2 * F)"), "<string>", "exec"), ns)
    rows = [r.detail for s in (0, 1) for r in grade(ns, s).rows if r.function == "activation_peak" and r.status != "ok"]
    assert rows and all(d.startswith("full, ") and "too high" in d and d.endswith(
        "which projections read a tensor that another operator already saves?") for d in rows), rows
    assert not any("two moments" in d for d in rows), rows


def test_the_two_moments_hint_needs_one_moment_right():
    """Finding 4: checkpointed, a peak equal to the smaller of the two moments gets the two-moments hint;
    one off by a term of neither (12,345 B) does not."""
    from gpumem.chapters.ch08_finetuning import lab_parts
    from test_lab08_adversarial import LLAMA3_8B
    ft, seq = lab_draw.LADDER["full"], 512
    parts = lab_acts.peak_parts(lab_draw.config(LLAMA3_8B), ft, seq, 1, "full", 0.0)
    smaller = min(parts["forward_peak"], parts["recompute_peak"])
    assert smaller < parts["peak"]
    said = lab_parts._acts_hint(ft, "full", smaller, parts, LLAMA3_8B, seq, 1)
    assert "two moments" in said or "end of the forward" in said, said
    for got in (parts["peak"] - 12_345, parts["peak"] + 12_345):
        assert "moment" not in lab_parts._acts_hint(ft, "full", got, parts, LLAMA3_8B, seq, 1)


def test_nf4_on_every_tensor_asks_which_tensors_are_nf4():
    """Finding 5 (-mistakes1): QLoRA's base_weights with the embedding, the head (untied) and every norm
    (2 per layer and the final one) stored as NF4 too, by hand half a byte each instead of 2: each
    role_bytes row asks which tensors QLoRA stores as NF4, and gives no list of them."""
    ns = solution()
    right = ns["role_bytes"]

    def role_bytes(model, ft):
        r = right(model, ft)
        if ft.base_dtype != "nf4":
            return r
        h, V, L = model["d_model"], model["vocab"], model["n_layers"]
        rest = V * h * (1 if model["tie_embeddings"] else 2) + (2 * L + 1) * h
        return r | {"base_weights": r["base_weights"] - 2 * rest + (rest + 1) // 2}
    ns["role_bytes"] = role_bytes
    rows = [r.detail for r in grade(ns, 4).rows if r.function == "role_bytes"]
    assert len(rows) == 3 and all("base_weights: yours is" in d and "too low" in d and d.endswith(
        "which tensors does QLoRA store as NF4?") for d in rows), rows
    assert not any(w in d for d in rows for w in ("embedding", "norm", "head")), rows


_RAW = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16,
        "num_key_value_heads": 2, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 256,
        "hidden_act": "silu", "max_position_embeddings": 64, "tie_word_embeddings": False}


def _more_tracers():
    import torch

    from gpumem.memory import hf_trace, tracer
    return {"gpumem.memory.hf_trace.saved_tensors": lambda: hf_trace.saved_tensors(_RAW, 16),
            "gpumem.memory.hf_trace.trace_hf": lambda: hf_trace.trace_hf(_RAW, 16),
            "gpumem.memory.hf_trace.build_hf": lambda: hf_trace.build_hf(_RAW),
            "gpumem.memory.tracer.build_with": lambda: tracer.build_with(lambda: torch.nn.Linear(4, 4), "mixed", True)}


@pytest.mark.parametrize("name", ["gpumem.memory.hf_trace.saved_tensors", "gpumem.memory.hf_trace.trace_hf",
                                  "gpumem.memory.hf_trace.build_hf", "gpumem.memory.tracer.build_with"])
def test_the_other_tracers_are_refused_by_name(name):
    """Finding 6: hf_trace's tracers and tracer.build_with measure a step too; a learner's function
    that calls one is refused by the library block, naming it, not by the frame rule."""
    from gpumem.chapters.ch08_finetuning import lab_guard
    run = _more_tracers()[name]
    lab_guard.refresh()

    def activation_peak(*args):       # the learner's function: it measures instead of counting
        run()
        return 0
    with pytest.raises(RuntimeError) as refused:
        lab_guard.guarded(activation_peak)()
    assert f"(it called {name})" in str(refused.value), str(refused.value)


def _tiny_cell(folder: str) -> tuple[dict, str, str]:
    """(the tiny layer's config, cell 8's stored output, cell 9's text) of the lab or its solution."""
    import ast
    import json

    from conftest import ROOT
    from test_lab08_adversarial import LAB
    cells = json.loads((ROOT / folder / f"{LAB}.ipynb").read_text())["cells"]
    i = next(i for i, c in enumerate(cells) if c["cell_type"] == "code" and "tiny = {" in "".join(c["source"]))
    source = "".join(cells[i]["source"])
    tiny = ast.literal_eval(source[source.index("tiny = {") + 7:source.index("}", source.index("tiny = {")) + 1])
    out = "".join("".join(o.get("text", "")) for o in cells[i].get("outputs", []))
    return tiny, out, "".join(cells[i + 1]["source"])


@pytest.mark.parametrize("folder", ["solutions", "labs"])
def test_the_tiny_layers_widths_do_not_collide(folder):
    """Finding 7: cells 8 and 9's tiny layer; every width at 2 and 4 B an element (h, q, k, F, r = 8) is
    its own figure, and cell 9 reads the figures without a hedge, each as the cell's widths give it."""
    tiny, _, text = _tiny_cell(folder)
    h, hd = tiny["hidden_size"], tiny["head_dim"]
    widths = {"h": h, "q": tiny["num_attention_heads"] * hd, "k": tiny["num_key_value_heads"] * hd,
              "F": tiny["intermediate_size"], "r": 8}
    figures = [n * w for w in widths.values() for n in (2, 4)]
    assert len(set(figures)) == len(figures), widths
    assert "(or" not in text, text
    for name in ("h", "q", "k", "F", "r"):
        assert f"{2 * widths[name]} is 2{name}" in text, (name, text)


def test_the_tiny_layers_stored_output_reads_by_its_widths():
    """Finding 7: cell 8's stored output, re-run with the new widths: o's adapter A saves its input, a
    bf16 copy of attention's output (2 B x n_heads x head_dim a token), and q's A a copy of the
    normed hidden state (2 B x hidden_size); each fp32 adapter's bf16 cast of A is 2 B x r x its
    in-features once."""
    tiny, out, _ = _tiny_cell("solutions")
    h, q = tiny["hidden_size"], tiny["num_attention_heads"] * tiny["head_dim"]
    fp32 = out.split("LoRA r=8, fp32 adapters")[1].split("LoRA r=8, bf16")[0]
    flat = " ".join(fp32.split())
    assert f"o.lora_A {2 * q} (+{2 * 8 * q:,})" in flat and f"q.lora_A {2 * h} (+{2 * 8 * h:,})" in flat, flat
