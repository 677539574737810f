"""Chapter 07, the graded checklist: every question answered right and wrong through the
plain-text mode on several seeds, every numeric answer re-derived by hand from the numbers on
screen (never by calling the function that computes it), pointers that name real notebook
sections, progress saved per item and reloaded, and a summary that lists what was missed.
"""

import json
import math
import re

import pytest

from conftest import ROOT
from gpumem.chapters import ch07_must_understand as ch
from gpumem.memory import zero3_schedule
from gpumem.course.checklist import Checklist, notebook_headings
from gpumem.course.quiz import Choice, Numeric, progress_file
from gpumem.timing.compute import KERNEL_SHARE

SEEDS = range(6)
QUIZ, CHECKLIST = ch.QUIZ, ch.CHECKLIST
GB, GiB = 10**9, 2**30
# bytes per parameter (weights, gradients, optimizer) by how a recipe is described
RECIPE_BYTES = {"everything in bf16": (2, 2, 4), "standard mixed precision": (2, 2, 12),
                "mixed precision with fp32 gradients": (2, 4, 12)}
# Meta's configs: layers, d_model, query heads, kv heads (head dim 128), FFN, vocab
LLAMA = {"Llama-3-8B": (32, 4096, 32, 8, 14_336, 128_256), "Llama-3-70B": (80, 8192, 64, 8, 28_672, 128_256),
         "Llama-3.1-405B": (126, 16_384, 128, 8, 53_248, 128_256)}


@pytest.fixture(autouse=True)
def _new_sitting():
    """Each test is a new sitting of the chapter's quiz (what a restarted kernel gives)."""
    QUIZ.new_sitting()


def num(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in {text!r}"
    return float(match.group(1).replace(",", ""))


def model_of(prompt: str) -> tuple:
    return LLAMA[next(m for m in sorted(LLAMA, key=len, reverse=True) if m in prompt)]


def recipe_of(prompt: str) -> tuple[int, int, int]:
    return next(b for words, b in RECIPE_BYTES.items() if words in prompt)


def shard(n: int, k: int) -> int:
    return -(-n // k)


def draws(qid: str, count: int = 24):
    """The question on ``count`` seeded draws (the same object, with that draw's numbers)."""
    QUIZ.seed(0)
    for _ in range(count):
        QUIZ.renew(qid, quiet=True)
        yield QUIZ._get(qid)


# -- grading, both ways, through the text mode ------------------------------------------------

def right_answer(q) -> str | int:
    if isinstance(q, Choice):
        return q.answer
    return f"{q.value():.6g} {q.unit_now()}".strip()


def wrong_answer(q) -> str | int:
    if isinstance(q, Choice):
        return (q.answer + 1) % len(q.options)
    value = q.value()
    return f"{value * 1.37 + 3:.6g} {q.unit_now()}".strip()


@pytest.mark.parametrize("seed", SEEDS)
def test_every_question_graded_right_and_wrong_in_text_mode(seed, capsys, monkeypatch):
    monkeypatch.setenv("GPUMEM_QUIZ_MODE", "text")
    QUIZ.seed(seed)
    for q in QUIZ.questions:
        assert QUIZ.answer(q.id, wrong_answer(q)) is False, q.id
        out = capsys.readouterr().out
        assert out.startswith("Not quite") and "Hint:" in out and q.expected() not in out, (q.id, out)
        assert QUIZ.answer(q.id, right_answer(q)) is True, q.id
        out = capsys.readouterr().out
        assert out.startswith("Correct") and " See notebook " in out, (q.id, out)
    saved = json.loads(progress_file().read_text())["07_must_understand"]
    assert all(saved[q.id] == {"correct": True, "attempts": 2} for q in QUIZ.questions)
    assert "6 of 6 items done." in CHECKLIST.view()
    assert CHECKLIST.summary().startswith("All 6 items done")


@pytest.mark.parametrize("seed", SEEDS)
def test_two_wrong_answers_show_the_answer_and_earn_nothing(seed, capsys, monkeypatch):
    monkeypatch.setenv("GPUMEM_QUIZ_MODE", "text")
    QUIZ.seed(seed)
    for q in QUIZ.questions:
        QUIZ.answer(q.id, wrong_answer(q))
        QUIZ.answer(q.id, wrong_answer(q))
        out = capsys.readouterr().out.splitlines()[-1]
        assert out.startswith("Not quite") and f"the answer is {q.expected()}" in out, (q.id, out)
        assert QUIZ.answer(q.id, right_answer(q)) is True            # right, but not counted
        assert "not counted" in capsys.readouterr().out
    status = CHECKLIST.status()
    assert all(not s["earned"] and s["revealed"] == [q.id for q in item.questions]
               for item, s in zip(ch.ITEMS, status.values()))


def test_each_item_shows_in_text_mode_with_fresh_numbers(capsys, monkeypatch):
    monkeypatch.setenv("GPUMEM_QUIZ_MODE", "text")
    for n, item in enumerate(ch.ITEMS, 1):
        prompts = set()
        for _ in range(6):
            CHECKLIST.show(item.key)
            out = capsys.readouterr().out
            assert out.startswith(f"Item {n} of 6: {item.title}")
            flat = " ".join(out.split())
            assert all(" ".join(f"[{q.id}] {q.prompt_text()}".split()) in flat for q in item.questions)
            assert max(len(line) for line in out.splitlines()) <= 100
            prompts.add(out)
        assert len(prompts) > 1, item.key


# -- the checklist's shape --------------------------------------------------------------------

def test_six_items_of_four_or_more_questions_mixing_kinds():
    assert len(ch.ITEMS) == 6
    for item in ch.ITEMS:
        kinds = {type(q) for q in item.questions}
        assert len(item.questions) >= 4 and kinds == {Choice, Numeric}, item.key
    from gpumem.chapters import CHAPTERS
    entry = next(c for c in CHAPTERS if c.number == "07")
    assert entry.quiz == "quiz:QUIZ"


def test_every_question_has_a_hint_and_numeric_ones_draw_fresh_numbers():
    for q in QUIZ.questions:
        assert q.hint, q.id
        if isinstance(q, Numeric):
            assert q.drawn and len({d.prompt_text() for d in draws(q.id)}) > 2, q.id


def test_options_do_not_give_the_answer_away():
    choices = [q for q in QUIZ.questions if isinstance(q, Choice)]
    longest = 0
    for q in choices:
        options, answer = q._authored                   # as written; each attempt shuffles them
        right = options[answer]
        others = [o for i, o in enumerate(options) if i != answer]
        assert len(right) <= 1.3 * max(len(o) for o in others), q.id
        longest += len(right) > max(len(o) for o in others)
        assert all(not re.search(r"\b(because|so that|since)\b|, so ", o) for o in options), q.id
        assert "; " not in right, q.id                   # the right option is one clause, no reason glued on
    positions = [sum(q._authored[1] == i for q in choices) for i in range(4)]
    assert max(positions) <= 0.4 * len(choices) and min(positions) >= 1, positions
    assert longest <= len(choices) / 3, longest          # the right option is not the longest as a rule


def test_every_text_renders_on_every_draw():
    for seed in range(24):
        QUIZ.seed(seed)
        for q in QUIZ.questions:
            assert "{" not in q.prompt_text() + q.explanation_text(), q.id
            if isinstance(q, Numeric):
                ctx = {**q.numbers, "expected": q.value(), "unit": q.unit_now()}
                for wrong, _ in q.traps:
                    assert "{" not in q.hint_for(wrong(ctx)), q.id


def test_pointers_name_existing_notebook_sections():
    pointers = CHECKLIST.pointers()
    assert {p.notebook[:2] for p in pointers} >= {"01", "02", "03", "04", "05", "06"}
    for p in pointers:
        path = ROOT / "notebooks" / f"{p.notebook}.ipynb"
        assert path.exists(), p
        assert p.heading in notebook_headings(path), p
    for item in ch.ITEMS:                      # each explanation names its own pointers
        for q in item.questions:
            assert all(p.text() in q.explanation_text() for p in item.see[q.id])
    flash, offload = ch.ITEMS[3], ch.ITEMS[4]      # items 4 and 5 point at their own chapters
    assert all(any(p.notebook.startswith("04") for p in flash.see[q.id]) for q in flash.questions)
    assert all(any(p.notebook.startswith("05") for p in offload.see[q.id]) for q in offload.questions)


# -- progress per item, reloaded, and the summary ---------------------------------------------

def test_progress_is_saved_per_item_reloaded_and_the_summary_lists_the_misses(capsys):
    QUIZ.seed(3)
    zero, gather = ch.ITEMS[0], ch.ITEMS[1]
    for q in zero.questions:
        assert QUIZ.answer(q.id, right_answer(q))
    first, *rest = gather.questions
    assert QUIZ.answer(first.id, right_answer(first))
    QUIZ.answer(rest[0].id, "show")
    QUIZ.answer(rest[1].id, wrong_answer(rest[1]))
    capsys.readouterr()
    # a new session: a fresh checklist over the same items reads the saved file
    again = Checklist("07_must_understand", ch.ITEMS)
    view = again.view()
    assert f"[x] 1. {zero.title} ({len(zero.questions)}/{len(zero.questions)})" in view
    assert f"[~] 2. {gather.title} (1/{len(gather.questions)})" in view
    assert f"[ ] 3. {ch.ITEMS[2].title} (0/" in view and "1 of 6 items done." in view
    assert f"      [x] {first.id}" in view and f"      [ ] {rest[0].id}" in view
    summary = again.summary()
    assert zero.title not in summary and "To revisit (5 of 6 items)" in summary
    assert f"- {rest[0].id}, answer shown: notebook " in summary
    assert f"- {rest[1].id}: notebook " in summary and f"- {first.id}" not in summary
    assert all(f"- {q.id}" in summary for q in ch.ITEMS[5].questions)
    assert max(len(line) for line in summary.splitlines()) <= 100
    for qid in (rest[0].id, rest[1].id):       # each entry names the pointers of its question
        entry = " ".join(summary.split(f"- {qid}")[1].split("\n   - ")[0].split())
        assert all(p.text() in entry for p in gather.see[qid])
    # explanations are not pointed twice by a second checklist over the same questions
    assert again.quiz._get(first.id).explanation_text().count(" See notebook ") == 1


# -- every numeric answer by hand, from the prompt -----------------------------------------------

def test_zero_saving():
    for q in draws("zero-saving"):
        p = q.prompt_text()
        n, stage, psi = num(r"over (\d+) GPUs", p), num(r"ZeRO-(\d)", p), num(r"\(([\d,]+) parameters", p)
        a, b, c = recipe_of(p)
        per = {1: a + b + c / n, 2: a + (b + c) / n, 3: (a + b + c) / n}[stage]
        assert q.value() == pytest.approx(100 * (1 - per / (a + b + c)), abs=0.01)
        assert psi == next(x for x in [8_030_261_248, 70_553_706_496, 405_853_388_800] if x == psi)
    q = next(d for d in draws("zero-saving") if "ZeRO-1" in d.prompt_text())
    assert not q.grade(100 * (1 - 1 / num(r"over (\d+) GPUs", q.prompt_text())))


def test_zero_fewest():
    for q in draws("zero-fewest"):
        p = q.prompt_text()
        psi, usable, stage = int(num(r"\(([\d,]+) parameters", p)), num(r"has ([\d,]+) bytes", p), num(r"ZeRO-(\d)", p)
        a, b, c = recipe_of(p)
        whole, sharded = (a + b, c) if stage == 1 else (a, b + c)
        k = 1
        while whole * psi + sharded * shard(psi, k) > usable:
            k += 1
        assert q.value() == k > 1


def test_zero_limit():
    seen = set()
    for q in draws("zero-limit"):
        p = q.prompt_text()
        a, b, c = recipe_of(p)
        stage = num(r"under ZeRO-(\d)", p)
        whole = a + b if stage == 1 else a
        assert q.value() == pytest.approx((a + b + c) / whole, rel=1e-6)
        seen.add((a + b + c, stage))
    assert len(seen) >= 4                      # recipes and stages vary: not one fixed "4x"


def test_zero3_comm_seconds():
    for q in draws("zero3-comm-seconds"):
        p = q.prompt_text()
        psi, n, bw = num(r"\(([\d,]+) parameters", p), num(r"on (\d+) ", p), num(r"([\d.]+) GB/s", p)
        assert q.value() == pytest.approx(3 * 2 * psi * (n - 1) / n / (bw * GB), rel=1e-3)
        assert not q.grade(2 * 2 * psi * (n - 1) / n / (bw * GB))


def test_gather_break_even_and_exposed():
    for q in draws("gather-break-even"):
        p = q.prompt_text()
        psi, n = num(r"\(([\d,]+) parameters", p), num(r"on (\d+) ", p)
        fwd, bw = num(r"receives ([\d,.]+) GB", p), num(r"([\d.]+) GB/s", p)
        share, peak = num(r"at (\d+) % of", p) / 100, num(r"of ([\d,]+) TFLOP/s", p) * 1e12
        assert share == pytest.approx(KERNEL_SHARE, abs=0.005)     # the window: the planner's compute
        assert fwd == pytest.approx(2 * psi * (n - 1) / n / GB, abs=0.06)   # forward gathers psi once
        assert q.value() == pytest.approx(fwd * GB / (bw * GB) * peak * share / (2 * psi), rel=0.01)
    seen = set()
    for q in draws("gather-exposed"):
        p = q.prompt_text()
        psi, tokens = num(r"\(([\d,]+) parameters", p), num(r"latency aside\), ([\d,]+) tokens", p)
        fwd, bwd = num(r"collectives is ([\d,.]+) GB in forward", p), num(r"and ([\d,.]+) GB in backward", p)
        bw, share = num(r"([\d.]+) GB/s", p), num(r"at (\d+) % of", p) / 100
        peak = num(r"of ([\d,]+) TFLOP/s", p) * 1e12
        speed = peak * share
        hand = max(0, fwd / bw - 2 * psi * tokens / speed) + max(0, bwd / bw - 4 * psi * tokens / speed)
        assert q.value() == pytest.approx(hand, rel=0.01, abs=1e-3)
        seen.add(hand > 0)
    assert seen == {True, False}


def layer_bytes(model: tuple, seq: int, mb: int = 1) -> int:
    """One Llama layer's saved bytes with a flash kernel, fused RMSNorm, bf16, by hand."""
    _, h, a, kv, f, _ = model
    t, k = seq * mb, kv * 128
    return 2 * (2 * t * h + 4 * t) + 2 * t * h + 2 * t * (h + 2 * k) + 2 * t * h + 4 * a * t + 2 * t * h + 8 * t * f


def test_checkpoint_bytes_and_flops():
    for q in draws("ckpt-kept"):
        p = q.prompt_text()
        m = model_of(p)
        seq, mb = num(r"sequences of ([\d,]+) tokens", p), num(r"micro-batch (\d+)", p)
        assert num(r"each layer keeps ([\d.]+) GB", p) == pytest.approx(layer_bytes(m, int(seq), int(mb)) / GB, abs=6e-4)
        assert q.value() == pytest.approx(m[0] * 2 * mb * seq * m[1] / GB, rel=1e-9)
    for q in draws("ckpt-segment-peak"):
        p = q.prompt_text()
        m, seq = model_of(p), num(r"sequences of ([\d,]+) tokens", p)
        layer, segs, k = num(r"one layer keeps ([\d.]+) GB", p), num(r"in (\d+) segments", p), num(r"segments of (\d+)", p)
        assert segs * k == m[0]
        c = 2 * seq * m[1] / GB
        assert q.value() == pytest.approx(segs * c + k * layer - c, rel=0.005)
        one = m[0] * c + layer - c                     # one-layer segments, by hand
        text = q.explanation_text()
        assert ("lower than the" in text) == (q.value() < one), text
        best_k = math.sqrt(m[0] * c / layer)
        assert num(r"= ([\d.]+) layers per segment", text) == pytest.approx(best_k, abs=0.06)
    kinds = set()
    for q in draws("ckpt-cost"):
        p = q.prompt_text()
        m, seq = model_of(p), num(r"sequences of ([\d,]+) tokens", p)
        _, h, a, kv, f, v = m
        layer = num(r"forward costs ([\d.]+) TFLOP", p)
        assert layer == pytest.approx((2 * seq * (2 * h * h + 2 * h * kv * 128 + 3 * h * f) + 4 * seq**2 * h) / 1e12,
                                      abs=6e-5)
        rerun = math.ceil(m[0] / 2) if "layers 0, 2, 4" in p else m[0]
        kinds.add(rerun == m[0])
        assert q.value() == pytest.approx(100 * rerun * layer / num(r"head included\) ([\d,.]+) TFLOP", p), rel=0.002)
    assert kinds == {True, False}


def test_flash_attention_bytes():
    for q in draws("flash-probs"):
        p = q.prompt_text()
        layers, _, heads, kv, _, _ = model_of(p)
        seq, mb = num(r"sequences of ([\d,]+)", p), num(r"micro-batch (\d+)", p)
        assert q.value() == pytest.approx(layers * heads * seq**2 * mb * 2 / GiB, rel=1e-9)
        assert not q.grade(layers * kv * seq**2 * mb * 2 / GiB)
    for q in draws("flash-stats"):
        assert q.value() == num(r"at sequence ([\d,]+)", q.prompt_text()) / 2
    for q in draws("flash-growth"):
        p = q.prompt_text()
        _, h, heads, *_ = model_of(p)
        seq, long = num(r"At sequence ([\d,]+)", p), num(r"at sequence ([\d,]+)\?", p)
        lin, quad, x = num(r"keeps ([\d.]+) GB", p), num(r"and ([\d.]+) GB that grows", p), long / seq
        assert quad == pytest.approx((2 * heads * seq**2 + seq**2) / GB, abs=6e-5)   # bf16 P + bool mask
        assert q.value() == pytest.approx((x * lin + x * x * quad) / (lin + quad), rel=2e-3)


def _offload_hand(p: str) -> tuple[float, float]:
    """(bytes per GPU left on it, bytes per GPU sent to the host), by hand from what DeepSpeed 0.19.8
    allocates with offload_optimizer cpu (chapter 05 measures it): the GPU keeps the bf16 parameters
    (whole at ZeRO-1/2, its shard at 3; none with offload_param) and, at ZeRO-1 only, backward's whole
    bf16 gradient until the end-of-backward reduction; the host keeps fp32 master 4 + m 4 + v 4 + the
    optimizer's fp32 gradient 4 = 16 B per shard element, ZeRO-3's bf16 gradient partition (2 B, on
    the host under offload) and offloaded bf16 parameter shards (2 B). Both recipes: the same run."""
    psi, n, zero = int(num(r"\(([\d,]+) parameters", p)), int(num(r"on (\d+) GPUs", p)), num(r"ZeRO-(\d)", p)
    params_off = "and the bf16 parameters" in p
    s = shard(psi, n)
    gpu = (0 if params_off else 2 * (s if zero == 3 else psi)) + (2 * psi if zero == 1 else 0)
    host = 16 * s + (2 * s if zero == 3 else 0) + (2 * s if params_off else 0)
    return gpu, host


def test_offload_host_for_8b_zero2_by_hand():
    """Llama-3-8B, ZeRO-2 + optimizer to CPU, 8 GPUs: 16 B x shard x 8 per node = 128.5 GB."""
    prompt = ("Llama-3-8B (8,030,261,248 parameters) trains with mixed-ds, under ZeRO-2 on 8 GPUs, "
              "8 GPUs per node, with the optimizer offloaded")
    assert 8 * _offload_hand(prompt)[1] / GB == pytest.approx(128.48, abs=0.01)


def test_offload_bytes_and_seconds():
    for q in draws("offload-left"):
        assert q.value() == pytest.approx(_offload_hand(q.prompt_text())[0] / GB, rel=1e-9)
    for q in draws("offload-host"):
        p = q.prompt_text()
        host = _offload_hand(p)[1]
        assert q.value() == pytest.approx(min(8, num(r"on (\d+) GPUs", p)) * host / GB, rel=1e-9)
        text = q.explanation_text()           # the explanation's terms add up to the answer
        terms = [float(x) for x in re.findall(r"([\d.]+) GB \(\d+ B of", text)]
        per_b = [int(x) for x in re.findall(r"\(([\d]+) B of", text)]
        assert sum(terms) == pytest.approx(host / GB, abs=0.006 * len(terms))
        assert num(r"= ([\d.]+) GB\. ", text) == pytest.approx(host / GB, abs=0.006)
        assert sum(per_b) * shard(int(num(r"\(([\d,]+) parameters", p)), int(num(r"on (\d+) GPUs", p))) == host
        assert num(r"offloads (\d+) B:", text) == sum(per_b)
    for q in draws("offload-nvme-seconds"):
        p = q.prompt_text()
        psi, n = num(r"\(([\d,]+) parameters", p), num(r"on (\d+) ", p)
        states, read, write = num(r"on NVMe: ([\d,.]+) GB", p), num(r"\(([\d.]+) GB/s read", p), num(r"([\d.]+) GB/s write", p)
        assert states == pytest.approx(16 * psi / n / GB, abs=0.006)     # 12 B of states + the fp32 gradient
        assert q.value() == pytest.approx(states / read + states / write, rel=2e-3)
    for q in draws("offload-break-even"):
        p = q.prompt_text()
        psi, s = num(r"\(([\d,]+) parameters", p), num(r"shard of ([\d,]+) parameters", p)
        adam, pcie = num(r"with AdamW at ([\d.]+) billion", p) * 1e9, num(r"PCIe moves ([\d.]+) GB/s", p) * GB
        ups = {"once": 1, "twice": 2}[re.search(r"copied up (once|twice)", p).group(1)]
        peak = num(r"of ([\d,]+) TFLOP/s", p) * 1e12
        assert ("lives in host memory" in p) == ("and the bf16 parameters offloaded" in p)
        share = num(r"per token at (\d+) % of", p) / 100      # the planner's KERNEL_SHARE
        assert share == pytest.approx(KERNEL_SHARE, abs=0.005)
        slowest = max(2 * s / pcie, ups * 2 * s / pcie, s / adam)
        # the answer is a whole token count, rounded up
        assert q.value() == pytest.approx(slowest * peak * share / (6 * psi), rel=2e-3, abs=1)


def test_plans_fewest_gpus_and_offloaded_total():
    for q in draws("plan-fewest"):
        p = q.prompt_text()
        psi, usable = int(num(r"\(([\d,]+) parameters", p)), num(r"\(([\d,]+) bytes usable", p)
        acts, ws = num(r"([\d,]+) bytes of activations", p), num(r"([\d,]+) bytes of ZeRO-3 working", p)
        assert num(r"lists, per GPU, ([\d,]+) bytes of model states", p) == 16 * shard(psi, 8)
        d = model_of(p)[1]
        name = {4096: "llama-3-8b", 8192: "llama-3-70b", 16_384: "llama-3.1-405b"}[d]
        steady = zero3_schedule.steady_peak(name)["bytes"]   # the replay, checked against DeepSpeed in test_02
        assert ws == steady + 2 * 128_256 * d + 2 * 5e8      # + the head's gradient, DeepSpeed's reduce bucket
        k = 1
        while 16 * shard(psi, k) + acts + ws > usable:
            k += 1
        assert q.value() == k
    for q in draws("plan-offload"):
        p = q.prompt_text()
        psi, n = int(num(r"\(([\d,]+) parameters", p)), int(num(r"on (\d+) ", p))
        acts, ws = num(r"holds ([\d.]+) GB of activations", p), num(r"working set of ([\d.]+) GB", p)
        # DeepSpeed's stage3.py puts the 16-bit gradient partition on the CPU when the optimizer
        # is offloaded: only the bf16 weight shard stays on the GPU
        assert q.value() == pytest.approx(2 * shard(psi, n) / GB + acts + ws, abs=0.011)


def test_fixed_choices_explain_with_computed_numbers():
    q = QUIZ._get("plan-8b-one-gpu")
    text = q.explanation_text()
    assert "optimizer to CPU, full checkpointing" in text and "GB" in text
    gb = [float(x) for x in re.findall(r": ([\d.]+) GB", text)]
    usable = float(re.search(r"against the ([\d.]+) GB usable", text).group(1))
    assert gb[0] > usable and gb[1] > usable and gb[2] < usable      # only the offloaded one fits
    assert gb[0] > 16 * 8_030_261_248 / GB                          # 128.5 GB of states alone
    slow = QUIZ._get("plan-slow-link").explanation_text()
    assert "0.39 GB/s" not in slow and "HYBRID_SHARD" in slow and "MiCS" in slow
    assert "hpZ is another thing" in slow and "only backward's" in slow


def test_layout_choices_agree_with_the_planner_and_a_hand_count():
    from gpumem.chapters.ch07_must_understand import combine_items as ci
    from gpumem.planner import plan
    psi8, psi405 = 8_030_261_248, 405_853_388_800
    # 8B on 64 GPUs, one 25 Gb/s port per node of 8 (achieved 47/50, nccl-tests #290): a ring
    # crosses each node's port once, so the port carries one GPU's share (the review's D4 count)
    port = 25e9 / 8 * 0.94
    zero3 = 2.985 * 2 * psi8 * 63 / 64 / port        # per micro-batch, ~2 psi gathered + 1 psi reduce-scattered
    zero1 = 2 * 2 * psi8 * 63 / 64 / port            # per step: reduce-scatter + all-gather of bf16
    hybrid = 2 * 2 * psi8 * 7 / 8 / port             # per step: 8 shards all-reduced across 8 nodes
    steps = ci.slow_link_steps()
    assert steps["zero1"]["comm_per_step_s"] == pytest.approx(zero1, rel=0.02)
    assert steps["mics"]["comm_per_step_s"] == pytest.approx(hybrid, rel=0.02)
    assert steps["zero3"]["comm_per_micro_batch_s"] == pytest.approx(zero3, rel=0.05)
    assert abs(zero1 - hybrid) < 0.15 * zero1 and 8 * zero3 > 5 * zero1      # as good; ZeRO-3 far worse
    q = QUIZ._get("plan-slow-link")
    assert "as many bytes per step" in q.expected() and "data parallelism only" in q.prompt_text()
    options, right = q._authored                            # as written (shuffled per attempt)
    assert "8x" in options[1] and right != 1                 # the per-GPU-share model, now a trap
    assert "MiCS" in q.explanation_text() and "0.39" not in q.explanation_text()
    # 405B on 1,024 H100s, 50 GB/s per GPU between nodes: ZeRO-3 alone cannot hide its gathers
    q = QUIZ._get("plan-3d")
    # one micro-batch of 4,096 tokens at KERNEL_SHARE (the planner's compute)
    compute = 6 * psi405 * 4096 / (KERNEL_SHARE * 989e12)
    _, right = q._authored
    assert 3 * 2 * psi405 * 1023 / 1024 / 50e9 > compute and right != 0
    best = plan("llama-3.1-405b", 1024, inter_node=50e9).best
    assert ci.FAMILIES[right][2](best.layout), best.layout.label()     # the planner still agrees
    assert best.layout.tp <= 8 and (best.layout.pp == 1 or best.layout.zero <= 1)
    assert best.layout.label() in q.explanation_text()


# -- hardware that exists, wrong answers that are told apart, options that do not explain themselves

PCIE_ONLY = ("L4", "T4")        # NVIDIA's L4 and T4 are PCIe cards without NVLink (datasheets)


def test_every_prompt_puts_the_gpus_on_hardware_that_exists():
    """Over many draws: an SXM board is never linked by PCIe alone, a PCIe card never by NVLink,
    one node or box holds at most 8 GPUs, and PCIe never joins two nodes."""
    QUIZ.seed(11)
    for _ in range(30):
        for q in QUIZ.questions:
            QUIZ.renew(q.id, quiet=True)
            p = q.prompt_text()
            pcie_link = re.search(r"PCIe only|PCIe inside|linked by PCIe|no NVLink", p)
            if "SXM" in p:
                assert not pcie_link, (q.id, p)
            if any(re.search(rf"\b{card}\b", p) for card in PCIE_ONLY):
                assert "NVLink" not in p.replace("no NVLink", ""), (q.id, p)
            if re.search(r"(inside|in) one (node|box|DGX|HGX|Google)|PCIe only", p):
                assert num(r"on (\d+) ", p) <= 8, (q.id, p)
            if pcie_link:
                assert not re.search(r"\d+ [^.,]*nodes", p), (q.id, p)


def test_traps_are_told_apart_from_the_right_answer_over_many_draws():
    """Every named mistake is rejected wherever it differs from the answer, and the answer as
    shown (rounded) is accepted; a mistake that lands within tolerance of the answer is a fault."""
    QUIZ.seed(5)
    told = {}                              # (id, trap) -> draws on which it differed and was rejected
    for q in (q for q in QUIZ.questions if isinstance(q, Numeric)):
        for _ in range(30):
            QUIZ.renew(q.id, quiet=True)
            want = q.value()
            assert q.grade(q.expected()) and q.grade(want), q.id
            ctx = {**q.numbers, "expected": want, "unit": q.unit_now()}
            for i, (wrong, _) in enumerate(q.traps):
                got = float(wrong(ctx))
                told.setdefault((q.id, i), 0)
                if math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12) or not math.isfinite(got):
                    continue                 # the mistake gives the right value on this draw
                assert not q.grade(got), (q.id, i, got, want, q.prompt_text())
                told[q.id, i] += 1
    # each trap is tested on some draw; gather-exposed's pooled-passes trap differs from the answer
    # only when exactly one pass is exposed, a narrow band of these draws
    assert [k for k, v in told.items() if not v] in ([], [("gather-exposed", 0)]), told


def test_the_rewritten_choices_are_parallel_and_carry_no_reason():
    for qid in ("flash-faster", "flash-kept", "offload-adam", "gather-backward", "plan-pp-zero3"):
        options, right = QUIZ._get(qid)._authored
        lengths = [len(o) for o in options]
        assert max(lengths) <= 1.25 * min(lengths), (qid, lengths)
        assert len(options[right]) < max(lengths), qid                 # not the longest
        assert not re.search(r"[:;]|\b(which|so|because|since|only)\b", options[right]), qid
    firsts = {qid: {o.split()[0] for o in QUIZ._get(qid)._authored[0]}
              for qid in ("flash-faster", "offload-adam")}
    assert firsts == {"flash-faster": {"It"}, "offload-adam": {"On"}}


def test_new_prompts_give_figures_not_the_procedure():
    QUIZ.seed(2)
    said = {"zero3-comm-seconds": ("all-gathers every weight", "(N-1)/N", "reduce-scatters the"),
            "gather-exposed": ("can hide only behind", "Forward costs 2"),
            "ckpt-segment-peak": ("count it once", "keeps only its input"),
            "plan-fewest": ("Whatever the GPU count",)}
    for qid, phrases in said.items():
        for q in draws(qid, 8):
            assert not any(x in q.prompt_text() for x in phrases), (qid, q.prompt_text())
    # each gives one figure the answer does not need
    assert all("tokens per GPU per step" in q.prompt_text() for q in draws("zero3-comm-seconds", 4))
    assert all("micro-batches per optimizer step" in q.prompt_text() for q in draws("gather-exposed", 4))
    assert all("vocabulary 128,256" in q.prompt_text() for q in draws("ckpt-segment-peak", 4))
    assert all(" layers) trains" in q.prompt_text() for q in draws("plan-fewest", 4))


def test_offload_break_even_says_what_moves_up():
    for q in draws("offload-break-even", 16):
        p = q.prompt_text()
        if "and the bf16 parameters offloaded" in p:
            assert "parameter shard, which lives in host memory, is copied up twice" in p
        else:
            assert "copied up once" in p and "stays on the GPU" in p and "lives in host" not in p
