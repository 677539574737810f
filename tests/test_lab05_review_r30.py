"""Lab 05, review r30 #5 and #6: part 3's steps accumulate gradients over drawn micro-batches.

The chapter prints one micro-batch's PCIe bytes, so the lab's checks draw 2-4 micro-batches in
three of the four part-3 cases and the learner must count what each further one moves. Expected
bytes here are counted by hand from DeepSpeed 0.19.8's source (stage3.py 2006-2049: each further
micro-batch a 16-bit round trip; stage_1_and_2.py async_accumulate_grad_in_cpu_via_gpu: 16-bit
down every micro-batch, up before each later one; every forward and backward fetches offloaded
parameters), and steps from the time engine, never from the grader's output.
"""

import json
import os
import random
from pathlib import Path

import pytest

from gpumem import chapters
from gpumem.chapters.ch05_offload import lab_draw, labcheck
from gpumem.chapters.ch05_offload import lab_reference as ref
from gpumem.memory import offload_cost
from gpumem.timing import offload_time
from test_labs_hostile import solution

ROOT = Path(__file__).resolve().parents[1]
LAB = "lab05_offload_budget"


@pytest.fixture(autouse=True)
def _tests_count_as_cells(monkeypatch):
    """This file's learner functions count as cells while graded (as in test_lab05_adversarial)."""
    monkeypatch.setenv("GPUMEM_TEST_CELLS", os.pathsep.join((__file__, "<learner cell>", "<string>")))


@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_hand_count_of_each_further_micro_batch(m):
    """s = 1,000 shard parameters: ZeRO-3 moves 6 B down and 2 B up for the first micro-batch and
    another 2 + 2 for each further one; ZeRO-2 the fp32 slice (4 B) down, and with several
    micro-batches 2 B down for each and 2 B up before each later one; offloaded parameters go up
    for every forward and backward (2 B each)."""
    s, n = 1000, 4000
    z3 = offload_cost.traffic_parts(n, "mixed", 3, 4, "optimizer", "cpu", micro_batches=m)
    assert (z3["grad_down"], z3["grad_up"]) == ((6 + 2 * (m - 1)) * s, (2 + 2 * (m - 1)) * s)
    z2 = offload_cost.traffic_parts(n, "mixed", 2, 4, "optimizer", "cpu", micro_batches=m)
    assert (z2["grad_down"], z2["grad_up"]) == ((4 + (2 * m if m > 1 else 0)) * s, 2 * (m - 1) * s)
    params = offload_cost.traffic_parts(n, "mixed", 3, 4, "optimizer+params", "nvme", micro_batches=m)
    assert params["param_fetch"] == params["nvme_param_read"] == 2 * 2 * m * s


@pytest.mark.parametrize("seed", range(4))
def test_each_check_draws_further_micro_batches(seed):
    """Two cases of each check accumulate over 2-4 micro-batches, one over 6 or 8, one over one; the arguments the
    learner's functions get end with the count, and the case's name says it."""
    cases = lab_draw.choose_cases(random.Random(300 + seed))
    counts = [args[-1] for _, args, _, _ in cases]
    assert sorted(counts)[0] == 1 and sorted(counts)[-1] in lab_draw.UPLOAD_BATCHES, counts     # r35 #1: the uploads'
    assert all(c in lab_draw.MICRO_BATCHES for c in sorted(counts)[1:-1]), counts
    for case, args, want, _ in cases:
        assert len(args) == 8 and f"{args[-1]} micro-batch" in case
        assert ref.choose(*args) == want


def _one_micro_batch(ns):
    """A learner's rung_seconds that prices every step as one micro-batch (the chapter's bytes)."""
    right = ns["rung_seconds"]
    return lambda n, ranks, rung, compute_s, links, micro_batches: right(n, ranks, rung, compute_s, links, 1)


@pytest.mark.parametrize("seed", range(4))
def test_a_step_of_one_micro_batch_is_named_on_a_drawn_case(seed):
    """Review r30 #5: pricing one micro-batch where the step has several fails a case of every
    check, and its first wrong rung is named by the hint (a question, no count); the solution
    itself equals the engine on every rung of every case."""
    ns = solution("lab05")
    ignores, named = _one_micro_batch(ns), []
    for case, (n, ranks, *_, c, links, m), _, _ in lab_draw.choose_cases(random.Random(400 + seed)):
        for rung in ref.RUNGS:
            right = ns["rung_seconds"](n, ranks, rung, c, links, m)
            zero, offload, device = ref.RUNGS[rung]
            engine = offload_time.step_time(n, "mixed", zero, ranks, offload, device, c, links, micro_batches=m)
            assert right == pytest.approx(engine["stock"], rel=1e-9), (case, rung)
            said = labcheck.seconds_problem(ignores(n, ranks, rung, c, links, m), n, ranks, rung, c, links, m)
            if said:
                assert m > 1 and labcheck.ONE_MICRO in said, (case, rung, said)
                named.append(case)
                break
    assert named
    assert "?" in labcheck.ONE_MICRO and not any(ch.isdigit() and ch not in "2013459" for ch in labcheck.ONE_MICRO)
    assert "2 + 2" not in labcheck.ONE_MICRO and " B " not in labcheck.ONE_MICRO


def test_check_names_a_step_of_one_micro_batch(monkeypatch):
    """Through check(): the solution with rung_seconds pricing one micro-batch fails a rung_seconds
    row with the hint (the swap files left out: no DeepSpeed run)."""
    ns = solution("lab05")
    ns.pop("swap_files")
    ns["rung_seconds"] = _one_micro_batch(ns)
    report = chapters.check_lab(LAB, ns, show=False, rng=random.Random(7))
    bad = [r for r in report.rows if r.function == "rung_seconds" and r.status != "ok"]
    # its opening at least: tied with a stream slip (compute paces both) the row is cut at 600 characters
    assert bad and labcheck.ONE_MICRO[:120] in bad[0].detail, report.summary()
    assert not report.solved


def _cells(folder):
    nb = json.loads((ROOT / folder / f"{LAB}.ipynb").read_text())
    return ["".join(c["source"]) for c in nb["cells"]]


@pytest.mark.parametrize("folder", ["labs", "solutions"])
def test_the_prompt_says_what_micro_batches_means_not_the_count(folder):
    """Cell 9 names the argument and what it means, not its bytes; cell 11 says the uploads share
    PCIe's host-to-device direction with the gradient partition's trip back up (review r30 #6)."""
    cells = _cells(folder)
    part3 = cells[9]
    assert "rung_seconds(n_params, ranks, rung, compute_s, links, micro_batches)" in part3
    assert "gradient accumulation" in part3 and "`compute_s` is forward plus backward of all of them" in " ".join(part3.split())
    assert "2 + 2" not in part3 and "another 2" not in part3
    assert "never set the window" not in part3            # with micro-batches the uploads can set it
    assert "host-to-device direction\nwith the gradient partition's trip back up" in cells[11]
    assert "links, micro_batches)` with your two functions" in cells[11]
