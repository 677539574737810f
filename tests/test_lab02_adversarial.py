"""Lab 02: the cheapest submissions that skip the idea (issue 21), each graded on 2 real CPU ranks
(gloo; nothing of torch.distributed is mocked) and failed with a row that says what was skipped.

Each starts from the solution notebook's function and changes one thing, as a learner would. To
stay cheap, each grades only the cases that tell (``labcheck.CASES`` narrowed per test)."""

import linecache
import math
import time

import psutil
import pytest
import torch
import torch.distributed as dist

from gpumem import chapters
from gpumem.chapters.ch02_zero import lab02_gpu, labcheck
from gpumem.course.grading import Report
from test_labs import _lab02_solution

LAUNCH = "        work = dist.reduce_scatter_single(mine, send, async_op=True)\n"
CAP = "        if len(in_flight) == 2:              # each in flight holds its flat copy: two at most, so the\n" \
      "            land(*in_flight.pop(0))          # oldest lands before this bucket's copy is made\n"
READY = """    def ready(p):
        if not queued[0]:                    # first gradient of this pass
            torch.autograd.Variable._execution_engine.queue_callback(end_of_backward)
            queued[0] = True
        bucket.append(p)
        if sum(q.grad.numel() * q.grad.element_size() for q in bucket) >= bucket_bytes:
            flush()
"""


def _narrowed(monkeypatch):
    """These tests narrow ``labcheck.CASES`` on purpose, a change gpumem.course.grader_seal
    refuses in a learner's kernel (a learner keeping only easy cases): the seal is off here. They
    read no row of Part 2's run (it grades the prediction against the grader's own count from the
    same measurements), so one round of its lone reduce-scatters does: 15 took 4.4 s a grading on
    a loaded 2-core machine."""
    from gpumem.course import grader_seal
    monkeypatch.setattr(grader_seal, "refuse_if_changed", lambda lab: None)
    monkeypatch.setattr(labcheck, "LONE_ROUNDS", 1)


def _lab02_with(source: str):
    """Grade ``source`` alone, readable by inspect as a notebook cell is (the other cells of the
    lab, its sweep among them, do not matter here)."""
    name = f"<adversarial {abs(hash(source))}>"
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    ns = {"math": math, "torch": torch, "dist": dist}
    exec(compile(source, name, "exec"), ns)
    report = chapters.check_lab("lab02_zero2_hooks", ns, show=False)
    assert not psutil.Process().children(recursive=True)      # both ranks ended
    return report


def grade(monkeypatch, cases: tuple, *swaps: tuple[str, str]):
    """Grade the solution with each (old, new) swapped in, on ``labcheck.CASES[i]`` for i in cases."""
    source = _lab02_solution()
    for old, new in swaps:
        assert old in source, old
        source = source.replace(old, new)
    _narrowed(monkeypatch)
    monkeypatch.setattr(labcheck, "CASES", tuple(labcheck.CASES[i] for i in cases))
    start = time.monotonic()
    report = _lab02_with(source)
    return report, time.monotonic() - start


def rows(report, kind: str):
    return [r for r in report.rows if kind in r.case]


def part1(report) -> list:
    """The failing rows of Part 1's fp32 cases (the bf16 case and Part 2 have rows of their own)."""
    return [r for r in report.problems if r.function == labcheck.FN and "bf16" not in r.case]


def test_the_cases_are_what_the_tests_below_assume():
    """1: several buckets; 2: one bucket for everything; 3: an unused layer and a bucket that
    divides nothing evenly. Every check draws seeds, buckets and the unused layer's places afresh
    (review r10 #5), keeping each role: by hand, tiny's gradients are 500,992 B (the budget cell),
    mini's 3,346,944 B with 262,144 B the largest, odd's 425,280 B with 57,600 B the largest, and
    odd has 30 parameter tensors (32 with the unused layer's two)."""
    from gpumem.chapters.ch02_zero import lab02_cases
    _, (_, _, _, several, _), (_, _, _, one, _), (model, _, _, odd, spare) = labcheck.CASES
    assert several == 200_000 and one >= 10**7 and spare and model == "odd" and odd % 4 != 0
    seen = set()
    for seed in range(200):
        (zero, mini, tiny, odd), bf16 = lab02_cases.draw(labcheck.CASES, seed)
        assert zero[3] == 0 and zero[0] == "tiny"
        assert mini[0] == "mini" and 190_000 <= mini[3] < 260_000 <= 3_346_944 - 262_144
        assert 2 * math.ceil(3_346_944 / mini[3]) + 1 < 39       # one reduce-scatter per tensor stays too many
        assert tiny[0] == "tiny" and tiny[3] >= 500_992
        assert odd[0] == "odd" and odd[3] % 2 == 1 and odd[3] <= 425_280 - 57_600
        w, b = odd[4]
        assert w != b and 0 <= w <= 31 and 0 <= b <= 31
        assert bf16[0] == "tiny" and 40_000 <= bf16[3] < 80_000      # several buckets of tiny's 250,496 bf16 bytes
        seen.add((mini[1], mini[3], odd[4]))
    assert len(seen) > 150                                            # a fresh draw, not a few fixed cases
    assert lab02_cases.draw(labcheck.CASES) != lab02_cases.draw(labcheck.CASES)


def test_unused_layer_lands_where_drawn():
    from gpumem.chapters.ch02_zero import lab02_ranks
    for at in ((0, 16), (31, 5), (12, 13)):
        names = lab02_ranks.build("odd", 1, at)[1]
        assert len(names) == 32 and (names.index("spare.weight"), names.index("spare.bias")) == at


def test_synchronous_reduce_scatter_is_named(monkeypatch):
    report, _ = grade(monkeypatch, (1, 2), (LAUNCH, "        dist.reduce_scatter_single(mine, send)\n"
                                                   "        work = None\n"),
                      ("    work.wait()\n", "    work and work.wait()\n"))
    over = rows(report, "async")
    assert over[0].status == "wrong" and "async_op=False inside a gradient hook" in over[0].detail
    assert over[1].status == "ok"              # one bucket, sent at the end: nothing to overlap with
    assert all(r.status == "ok" for r in part1(report) if "async" not in r.case)
    bf16 = rows(report, "bf16")[0]             # watched as the others (review r12 #6): its values are right
    assert bf16.status == "wrong" and "async_op=False inside a gradient hook" in bf16.detail


def test_waiting_right_after_the_launch_is_named(monkeypatch):
    """The overlap row names it. (Since review r22 the bytes held are sampled at each first wait as
    well, and a wait right after the launch comes while the bucket's gradients, their padded rows and
    the flat copy are all alive: the peak row fails first.)"""
    report, _ = grade(monkeypatch, (1,), (LAUNCH, LAUNCH + "        work.wait()\n"))
    rows_ = {r.case.split(": ")[1]: r.detail for r in part1(report)}
    assert "waited right after its launch" in rows_["async reduce-scatters overlapped with backward"]
    assert set(rows_) <= {"async reduce-scatters overlapped with backward", "peak full-gradient bytes during backward"}


def test_counting_arrivals_fails_the_unused_layer_with_a_clear_message_and_does_not_hang(monkeypatch):
    report, seconds = grade(monkeypatch, (0, 3), (READY, """    arrived = [0]

    def ready(p):
        bucket.append(p)
        if sum(q.grad.numel() * q.grad.element_size() for q in bucket) >= bucket_bytes:
            flush()
        arrived[0] += 1
        if arrived[0] == len(params):        # the last gradient of this pass
            arrived[0] = 0
            end_of_backward()
"""))
    shards = rows(report, "gradient shards")
    assert shards[0].status == "ok"            # every parameter used: counting works there
    assert shards[1].status == "wrong" and "get no gradient" in shards[1].detail      # named in params' order
    assert "spare.weight and spare.bias" in shards[1].detail or "spare.bias and spare.weight" in shards[1].detail
    assert "never reaches len(params)" in shards[1].detail
    over = rows(report, "async")
    assert all(r.status == "wrong" and "queued no callback on autograd's engine" in r.detail for r in over)
    assert seconds < 120


def test_one_all_reduce_after_backward_is_named(monkeypatch):
    report, _ = _all_reduce_after_backward(monkeypatch)
    assert "every gradient at once" in rows(report, "peak")[0].detail
    assert "backward called all_reduce 1 time(s)" in rows(report, "collectives")[0].detail
    assert "started after the last gradient had arrived" in rows(report, "async")[0].detail


def _all_reduce_after_backward(monkeypatch):
    _narrowed(monkeypatch)
    monkeypatch.setattr(labcheck, "CASES", (labcheck.CASES[1],))
    return _lab02_with('''
def install_zero2_hooks(params, grad_shards, bucket_bytes):
    world, rank = dist.get_world_size(), dist.get_rank()
    queued = [False]

    def at_the_end():                        # one all-reduce of every gradient, after backward
        queued[0] = False
        used = [i for i, p in enumerate(params) if p.grad is not None]
        flat = torch.cat([params[i].grad.reshape(-1) for i in used])
        dist.all_reduce(flat)
        flat /= world
        for i, g in zip(used, flat.split([params[i].numel() for i in used])):
            c = math.ceil(g.numel() / world)
            grad_shards[i] = torch.nn.functional.pad(g, (0, c * world - g.numel()))[rank * c:(rank + 1) * c].clone()
            params[i].grad = None

    def ready(p):
        if not queued[0]:
            torch.autograd.Variable._execution_engine.queue_callback(at_the_end)
            queued[0] = True

    for p in params:
        p.register_post_accumulate_grad_hook(ready)
'''), 0


def test_copies_sent_after_backward_are_metered_and_not_overlapped(monkeypatch):
    """Gradients copied out of .grad (GradMeter sees them freed) and all sent in the callback:
    the live-bytes meter still sees the copies, and nothing overlapped."""
    report, _ = grade(monkeypatch, (1,),
                      (READY.split("        bucket.append(p)\n")[1], ""),
                      ("        bucket.append(p)\n", "        stash[id(p)] = p.grad.clone()\n"
                                                      "        p.grad = None\n        bucket.append(p)\n"),
                      ("        if bucket:\n            flush()\n",
                       "        for p in bucket:\n            p.grad = stash.pop(id(p))\n"
                       "        if bucket:\n            flush()\n"),
                      ("bucket, in_flight, queued = [], [], [False]", "bucket, in_flight, queued, stash = [], [], [False], {}"))
    assert [r.case.split(": ")[1] for r in part1(report)] == ["peak full-gradient bytes during backward",
                                                                "async reduce-scatters overlapped with backward"]
    assert "copies of full gradients count even after .grad = None" in part1(report)[0].detail
    assert "nothing overlapped with backward" in part1(report)[1].detail


def test_full_gradient_copies_kept_after_sending_are_named(monkeypatch):
    """Reviewer's cheat: clone each gradient, set .grad = None (GradMeter sees it freed), send
    the clones as the solution does, but keep them: every gradient stays alive, as under ZeRO-1."""
    report, _ = grade(monkeypatch, (0,),
                      ("bucket, in_flight, queued = [], [], [False]", "bucket, in_flight, queued, kept = [], [], [False], {}"),
                      ("        grads = [p.grad for p in bucket]\n", "        grads = [kept[id(p)] for p in bucket]\n"),
                      ("        bucket.append(p)\n        if sum(q.grad.numel() * q.grad.element_size() for q in bucket)",
                       "        kept[id(p)] = p.grad.detach().clone()\n        p.grad = None\n"
                       "        bucket.append(p)\n        if sum(kept[id(q)].numel() * 4 for q in bucket)"))
    assert [r.case.split(": ")[1] for r in part1(report)] == ["peak full-gradient bytes during backward"]
    detail = part1(report)[0].detail
    assert "copies of full gradients count even after .grad = None" in detail
    # tiny, bucket 0 (the lab's budget cell: gradients 500,992 B, the largest 65,536 B, shards
    # 250,496 B on 2 ranks, 21 tensors): bound = 65,536 (.grad) + 2 x (65,536 + 4 x 2 x 21 padding)
    # (flat copies) + 250,496 (shards) = 447,440 B; the cheat holds the shards and every copy
    held = int(detail.split("kept ")[1].split(" B")[0].replace(",", ""))
    assert held >= 250_496 + 500_992 and "at most 447,440 B" in detail


def test_barrier_right_after_each_launch_is_named(monkeypatch):
    """dist.barrier() on gloo waits every collective before it: overlap faked, handles never waited."""
    report, _ = grade(monkeypatch, (0,), (LAUNCH, LAUNCH + "        dist.barrier()\n"))
    calls = rows(report, "collectives")[0]
    assert calls.status == "wrong" and "dist.barrier()" in calls.detail and "nothing overlaps" in calls.detail
    over = rows(report, "async")[0]
    assert over.status == "wrong" and "right after its launch (by dist.barrier())" in over.detail


def test_waiting_the_real_handle_behind_the_proxy_is_named(monkeypatch):
    report, _ = grade(monkeypatch, (0,), (LAUNCH, LAUNCH + "        work._work.wait()\n"))
    assert [r.case.split(": ")[1] for r in part1(report)] == ["async reduce-scatters overlapped with backward"]
    assert "right after its launch (by work._work)" in part1(report)[0].detail


def test_one_in_flight_at_a_time_is_named(monkeypatch):
    """Waiting the previous bucket at the next launch: never two in flight while backward runs."""
    report, _ = grade(monkeypatch, (0,), ("        if len(in_flight) == 2:", "        if len(in_flight) == 1:"))
    assert [r.case.split(": ")[1] for r in part1(report)] == ["async reduce-scatters overlapped with backward"]
    assert "never 2 in flight at once" in part1(report)[0].detail


def test_polling_is_completed_before_each_launch_is_no_wait(monkeypatch):
    """Review r25: hooks that land any finished bucket before each launch (``is_completed()``) were
    told "each was waited before the next launch" (23/27): every attribute read of the handle
    counted as a wait. On gloo ``is_completed()`` stays False until ``wait()`` (the reviewer's
    probe), so the poll lands nothing and the hooks are the solution's: every row passes."""
    poll = ("        for item in list(in_flight):         # land what has finished\n"
            "            if item[0].is_completed():\n"
            "                in_flight.remove(item)\n"
            "                land(*item)\n")
    report, _ = grade(monkeypatch, (0,), ("        if len(in_flight) == 2:", poll + "        if len(in_flight) == 2:"))
    assert not part1(report), [r.detail for r in part1(report)]


def test_wrong_shards_say_summed_or_not_rank_major():
    """The messages for the three usual mistakes, on hand-made shards (no ranks needed): gradient a
    = [1..6], b = [10, 20]; world 2, rank 0's shard of a is [1, 2, 3] averaged."""
    from gpumem.chapters.ch02_zero.lab02_weights import why_wrong
    a, b = torch.arange(1.0, 7.0), torch.tensor([10.0, 20.0])
    want = a[:3]
    assert "you summed, the reference averages over 2 ranks" in why_wrong(2 * want, want, [a, b], 2)
    # param-major layout: rank 0 gets the first half of [a | b] = a[0:4], its first 3 for a's shard... shifted
    got = torch.tensor([3.0, 4.0, 5.0])
    assert "not rank-major" in why_wrong(got, want, [a, b], 2)
    # review r12 #5: values from nowhere in the gradients (torch.empty's, read before the wait)
    for garbage in (torch.tensor([7.0, -7.0, 9.0]), torch.tensor([float("nan"), 0.0, 1e30])):
        assert "read (or divided) before its handle was waited" in why_wrong(garbage, want, [a, b], 2)
    assert why_wrong(want.clone(), want, [a, b], 2) == ""


def test_one_collective_per_parameter_is_named(monkeypatch):
    report, _ = grade(monkeypatch, (2, 3), (") >= bucket_bytes:", ") >= 0:"))
    calls = rows(report, "collectives")
    assert all(r.status == "wrong" and "one collective per bucket" in r.detail for r in calls)
    assert "at most 1 " in calls[0].detail


def test_every_bucket_in_flight_at_once_is_named(monkeypatch):
    """Every bucket in flight: the flat copies, alive until waited, add up to the gradients again;
    the live-bytes meter sees them, and the overlap row names the cause."""
    report, _ = grade(monkeypatch, (1,), (CAP, ""))
    assert [r.case.split(": ")[1] for r in part1(report)] == ["peak full-gradient bytes during backward",
                                                                "async reduce-scatters overlapped with backward"]
    assert "buckets were in flight at once" in part1(report)[1].detail


def test_gpu_part_says_why_it_is_skipped(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "no CUDA device" in lab02_gpu.cuda_reason()
    report = Report("lab02")
    assert lab02_gpu.grade(report, "").startswith("skipped (no CUDA device") and not report.rows
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert lab02_gpu.cuda_reason() == "needs 2 GPUs for NCCL's reduce-scatter; this machine has 1"


@pytest.mark.gpu
def test_solution_on_two_gpus(gpu_record):
    """With 2 GPUs, check() runs the solution's hooks over NCCL; the hooks' shards match an
    all-reduce of the same gradients and backward with them holds less than without."""
    reason = lab02_gpu.cuda_reason()
    if reason:
        pytest.skip(reason)
    report = _lab02_with(_lab02_solution())
    gpu = [r for r in report.rows if "GPU" in r.case]
    assert not report.problems and gpu and gpu[0].status == "ok", report.summary()
    r = lab02_gpu.run_source(_lab02_solution(), bucket=1 << 20, repeats=5)
    for key in ("plain_peak", "hooked_peak"):
        gpu_record(f"ch02.lab02_backward_{key}_bytes", r[key], "B")
    for key in ("plain_s", "hooked_s"):
        gpu_record(f"ch02.lab02_backward_{key}", r[key], "s")
    assert r["worst"] <= labcheck.GPU_ATOL
    assert r["hooked_peak"] < r["plain_peak"]


# The reviewer's three cheats that passed the named checks. Each is graded on one case with 2 steps
# (tiny, bucket 0: 21 buckets; pass 1 holds rank 1 back, pass 2 rank 0), which is enough to tell.
ONE = (("tiny", 3, 2, 0, False),)


def grade_on(monkeypatch, cases: tuple, *swaps: tuple[str, str]):
    source = _lab02_solution()
    for old, new in swaps:
        assert old in source, old
        source = source.replace(old, new)
    _narrowed(monkeypatch)
    monkeypatch.setattr(labcheck, "CASES", cases)
    return _lab02_with(source)


def _blocked(report, unseen: bool = False) -> str:
    """The overlap row says the hooks blocked, measured by the hold; with ``unseen``, the collectives
    row also says the process group ran a collective the grader's wrappers did not see."""
    want = ["async reduce-scatters overlapped with backward"]
    if unseen:
        want.insert(0, "collectives during backward")
        assert "gloo's own count" in part1(report)[0].detail and "went around them" in part1(report)[0].detail
    assert [r.case.split(": ")[1] for r in part1(report)] == want
    detail = part1(report)[-1].detail
    assert "held back by the grader's own arrival hook" in detail and "block right after each launch" in detail
    return detail


def test_a_barrier_the_guard_does_not_name_is_measured(monkeypatch):
    """``dist.group.WORLD.barrier().wait()``: the process group's own barrier, not ``dist.barrier``
    (no wrapper sees it, gloo's sequence number does); rank 0 computes no gradient until rank 1,
    held back, joins the collective."""
    report = grade_on(monkeypatch, ONE, (LAUNCH, LAUNCH + "        dist.group.WORLD.barrier().wait()\n"))
    assert "rank 0 computed no further gradient" in _blocked(report, unseen=True)


def test_waiting_the_handle_behind_the_proxys_private_slot_is_refused(monkeypatch):
    """``object.__getattribute__(work, "_h")`` took the real handle around the proxy (no wait recorded;
    the hold measured the block). The proxy now keeps only its launch's number (the real work is in
    the grader's module, review r12 #2) and the source is refused before it runs (r12 #1)."""
    _narrowed(monkeypatch)
    report = _lab02_with(_lab02_solution().replace(LAUNCH, LAUNCH + "        object.__getattribute__(work, '_h')[0].wait()\n"))
    assert [(r.case, r.detail.split(";")[0]) for r in part1(report)] == [
        ("no reaching into the grader", "line 23: uses the attribute .__getattribute__")]


def test_graded_handles_are_torchs_work_by_name_and_hold_no_work():
    """Review r12 #6: ``type(work).__name__ == "_Handle"`` told hooks whether they were graded (the
    bf16 case, the sweep and the GPU part got torch's Work). The proxy is a Work named as torch names
    it, and nothing in it is the real work (#2: it was behind the proxy's ``_h`` slot)."""
    from gpumem.chapters.ch02_zero import lab02_watch
    proxy = lab02_watch.Work(10**9)
    assert isinstance(proxy, dist.Work) and type(proxy).__name__ == type(proxy).__qualname__ == "Work"
    assert dist.Work.__name__ == dist.Work.__qualname__ == "Work"
    assert object.__getattribute__(proxy, "_id") == 10**9 and 10**9 not in lab02_watch._WORKS
    lab02_watch._WORKS[10**9] = "the work"
    del proxy                                                      # its entry goes with it
    assert 10**9 not in lab02_watch._WORKS


def test_copies_made_with_the_dispatch_modes_off_are_counted(monkeypatch):
    """Full-gradient copies made under ``_disable_current_modes()`` (the live meter, a dispatch mode,
    does not see them) and kept: the reachability scan counts them. Bound as in the test above:
    447,440 B for tiny, bucket 0; the cheat holds every copy (500,992 B) and the shards (250,496 B)."""
    report = grade_on(monkeypatch, ONE,
                      ("bucket, in_flight, queued = [], [], [False]", "bucket, in_flight, queued, kept = [], [], [False], {}"),
                      ("        grads = [p.grad for p in bucket]\n", "        grads = [kept[id(p)] for p in bucket]\n"),
                      ("        bucket.append(p)\n        if sum(q.grad.numel() * q.grad.element_size() for q in bucket)",
                       "        from torch.utils._python_dispatch import _disable_current_modes\n"
                       "        with _disable_current_modes():\n"
                       "            kept[id(p)] = p.grad.detach().clone()\n        p.grad = None\n"
                       "        bucket.append(p)\n        if sum(kept[id(q)].numel() * 4 for q in bucket)"))
    assert [r.case.split(": ")[1] for r in part1(report)] == ["peak full-gradient bytes during backward"]
    detail = part1(report)[0].detail
    assert "dispatch modes off" in detail and "at most 447,440 B" in detail
    held = int(detail.split("kept ")[1].split(" B")[0].replace(",", ""))
    assert held >= 250_496 + 500_992


def _pass(times: list[float], seqs: list[int], hold=None) -> dict:
    return {"times": times, "seqs": seqs, "hold": hold}


def test_the_hold_decides_by_the_order_of_two_clock_readings():
    """By hand: rank 1, held at its first arrival with no collective run yet, wakes at t = 10.
    Rank 0's hook at arrival 2 (t = 1) issues its first collective (its count goes 0 -> 1 by
    arrival 3): arrival 3 at t = 2 means backward went on while it was pending (overlapped); at
    t = 11, only after the held rank woke (blocked)."""
    from gpumem.chapters.ch02_zero import lab02_probe
    held = _pass([0.0, 10.5, 10.6, 10.7], [0, 0, 1, 1], hold=(0, 10.0))
    for t3, blocked in ((2.0, False), (11.0, True)):
        checked = _pass([0.5, 1.0, t3, t3 + 1], [0, 0, 1, 2])
        got = lab02_probe.grade_overlap([{"passes": [checked]}, {"passes": [held]}])
        assert (got is not None) == blocked and (not got or "rank 0 computed no further gradient" in got)
    # nothing issued before the last arrival, or the launching hook began after the wake: nothing
    # to test, and a probe that tested nothing fails
    for untested, why in ((_pass([0.5, 1.0], [0, 0]), "no collective before its last gradient"),
                          (_pass([9.95, 10.2, 10.3], [0, 0, 1]), "began +0.20 s from the held rank's wake")):
        got = lab02_probe.grade_overlap([{"passes": [untested]}, {"passes": [held]}])
        assert got and "could not test overlap on rank 0" in got and why in got
    assert lab02_probe.WINDOW_S > 0.05


# Review r10's cheats: the gradient data by another collective than the recorded one, and the
# grader's record edited. Graded on ONE (tiny, bucket 0, 2 steps: each rank is checked once).
DECOY = "        work = dist.reduce_scatter_tensor(torch.empty(1), torch.zeros(world), async_op=True)   # decoy\n"


def test_the_deprecated_reduce_scatter_tensor_is_a_reduce_scatter(monkeypatch):
    """torch 2.13 deprecates reduce_scatter_tensor in favour of reduce_scatter_single (the solution's
    call): a learner who follows an older tutorial and calls the alias passes every row."""
    report = grade_on(monkeypatch, ONE, ("dist.reduce_scatter_single(mine, send, async_op=True)",
                                         "dist.reduce_scatter_tensor(mine, send, async_op=True)"))
    assert not [r for r in report.problems if r.function == labcheck.FN], report.summary()


def test_synchronous_data_and_an_async_decoy_are_named(monkeypatch):
    """Review r10 (H): the bucket goes by a synchronous reduce_scatter_single and a 1-element
    asynchronous reduce-scatter is launched for the record. Tiny, bucket 0: 21 gradients, so 42
    reduce-scatters where 21 are allowed; the synchronous one is named in the overlap row."""
    report = grade_on(monkeypatch, ONE, (LAUNCH, "        dist.reduce_scatter_single(mine, send)\n" + DECOY))
    calls, over = rows(report, "collectives")[0], rows(report, "async")[0]
    assert calls.status == "wrong" and "42 reduce-scatters in one backward" in calls.detail
    assert over.status == "wrong" and "dist.reduce_scatter_single ran with async_op=False" in over.detail


def test_data_through_the_process_group_and_a_decoy_are_named(monkeypatch):
    """The bucket by the process group's own reduce-scatter (no torch.distributed function), an
    asynchronous decoy in its place: gloo's count shows the unseen collective, and the hold shows
    that backward stood still."""
    report = grade_on(monkeypatch, ONE, (LAUNCH, "        dist.group.WORLD._reduce_scatter_base(mine, send).wait()\n"
                                                 + DECOY))
    _blocked(report, unseen=True)


def test_decoy_alone_is_short_of_the_gradients(monkeypatch):
    """The decoy is all that is recorded once the data goes unseen by any route: its elements
    fall short of the padded gradients. (Here the shards are left unfilled: the decoy's own row.)"""
    from gpumem.chapters.ch02_zero import labcheck as lc
    p = {"seq_ops": 21, "ops": 21, "calls": {"reduce_scatter_tensor": 21}, "need": 125_504,
         "launches": [{"sent": 2}] * 21}
    got = lc._grade_calls([{"passes": [p]}, {"passes": [p]}], 21, 4 * 125_000, 0)
    assert "sent 42 elements" in got and "are 125,504" in got and "some other way" in got


RECORD_EDIT = '''def install_zero2_hooks(params, grad_shards, bucket_bytes):
    world, rank = dist.get_world_size(), dist.get_rank()
    grader = dist.all_reduce.func.__globals__                      # the wrappers' module
    real_all_reduce, rec = grader["_REAL"]["all_reduce"], grader["_REC"]
    index = {id(p): i for i, p in enumerate(params)}
    state = {"bytes": 0, "queued": False, "sent": 0}

    def fake_launch():                                             # what the grader will read
        rec.calls["reduce_scatter_tensor"] = rec.calls.get("reduce_scatter_tensor", 0) + 1
        rec.events += 1
        rec.launches.append({"name": "reduce_scatter_tensor", "async": True, "at": rec.arrivals, "waited": None,
                             "t": rec.events, "t_wait": None, "how": None, "sent": state["sent"]})
        state["bytes"] = state["sent"] = 0

    def end():
        if state["bytes"]:
            fake_launch()
        L = rec.launches
        for k, x in enumerate(L):                                  # "two in flight, oldest waited"
            x["waited"] = rec.arrivals
            x["t_wait"] = L[k + 2]["t"] - 0.5 if k + 2 < len(L) else rec.events + 1 + k
            x["how"] = "wait()"
        state["queued"] = False

    def ready(p):
        if not state["queued"]:
            torch.autograd.Variable._execution_engine.queue_callback(end)
            state["queued"] = True
        g = p.grad.clone()
        real_all_reduce(g)                                         # synchronous, whole tensor, unrecorded
        c = math.ceil(g.numel() / world)
        flat = torch.nn.functional.pad(g.reshape(-1), (0, c * world - g.numel()))
        grad_shards[index[id(p)]] = (flat[rank * c:(rank + 1) * c] / world).clone()
        state["bytes"] += g.numel() * g.element_size()
        state["sent"] += c * world
        p.grad = None
        if state["bytes"] >= bucket_bytes:
            fake_launch()

    for p in params:
        p.register_post_accumulate_grad_hook(ready)
'''


def test_an_edited_record_is_named(monkeypatch):
    """Review r10 (D), on today's grader: the wrappers hold no record in a closure or default any
    more, so the record is taken from their module; each gradient is all-reduced synchronously by
    the saved original and launches are written into the record. Gloo's own count of collectives
    disagrees with it, and the hold (the grader's arrival hook, not the record) shows the block.
    Since review r12 #1 the source is refused before it runs (``__globals__``); past that refusal,
    the ranks still name it."""
    _narrowed(monkeypatch)
    monkeypatch.setattr(labcheck, "CASES", ONE)
    refused = part1(_lab02_with(RECORD_EDIT))
    assert [(r.case, r.detail.split(";")[0]) for r in refused] == [
        ("no reaching into the grader", "line 3: uses the attribute .__globals__")]
    _unscanned(monkeypatch)
    _blocked(_lab02_with(RECORD_EDIT), unseen=True)


def test_every_collective_is_watched():
    """The wrappers come from distributed_c10d itself, not a hand list: every function a learner
    could send gradients with (review r10's list), synchronous or not, is among them."""
    from gpumem.chapters.ch02_zero import lab02_watch
    watched = set(lab02_watch.collectives(dist.distributed_c10d))
    assert {"reduce_scatter_tensor", "reduce_scatter_single", "reduce_scatter", "all_reduce",
            "all_reduce_coalesced", "reduce", "all_to_all", "all_to_all_single", "all_gather",
            "all_gather_into_tensor", "broadcast", "gather", "scatter", "send", "recv", "isend", "irecv",
            "batch_isend_irecv", "barrier"} <= watched
    assert not watched & {"get_rank", "get_world_size", "new_group", "destroy_process_group"}


def test_a_callback_queued_only_in_the_first_pass_is_named():
    """Review r10 #5: the callback is cleared after each backward; a pass that queued none after one
    that did gets its own message (records by hand: 3 arrivals, no launch)."""
    passes = [{"arrivals": 3, "launches": [], "queued": q} for q in (1, 0)]
    got = labcheck._grade_overlap([{"passes": passes}], several=False)
    assert "backward 2 queued no callback" in got and "queue one in every pass" in got
    never = labcheck._grade_overlap([{"passes": [dict(passes[1])]}], several=False)
    assert "backward 1 queued no callback" in never and "count of arrivals" in never


def test_bf16_shards_are_the_fp32_mean_by_hand():
    """1.0 + 2**-8 is not a bf16 number (8 significant bits): summed in bf16 the two ranks' gradients
    give 1.0 (round to even), halved 0.5; in fp32 the mean is 0.501953125. Two ranks, one gradient
    of 2 elements: rank r keeps element r."""
    from gpumem.chapters.ch02_zero import lab02_bf16
    g0, g1 = torch.tensor([1.0, 3.0], dtype=torch.bfloat16), torch.tensor([2.0**-8, 1.0], dtype=torch.bfloat16)
    res = lambda a, b: [{"grads": {0: g0}, "shards": {0: a}}, {"grads": {0: g1}, "shards": {0: b}}]  # noqa: E731
    assert lab02_bf16.grade(res(torch.tensor([0.501953125]), torch.tensor([2.0])), ["w"]) is None
    bad = lab02_bf16.grade(res(torch.tensor([0.5]), torch.tensor([2.0])), ["w"])
    assert "first shard off the fp32 mean: w on rank 0" in bad and "summed in bf16" not in bad
    assert "the bucket went over the wire in bf16" in bad
    kept = lab02_bf16.grade(res(torch.tensor([0.5], dtype=torch.bfloat16), torch.tensor([2.0])), ["w"])
    assert "is bfloat16: reduce in fp32" in kept


def test_bf16_shards_in_the_wrong_layout_name_the_layout():
    """Review r29 #3: a packing that is not rank-major got only "largest relative error 2.4e+27" on
    the bf16 row, which reads as a dtype fault. Two gradients, a of 4 elements and b of 2, packed
    param-major ([a | b], rank 1 gets [a3, b0, b1]): the row says what the fp32 rows say; values
    from nowhere, with an fp32 case's shards wrong, send the learner to those rows first."""
    from gpumem.chapters.ch02_zero import lab02_bf16
    bf = lambda *v: torch.tensor(v, dtype=torch.bfloat16)       # noqa: E731
    a0, a1, b0, b1 = bf(1.0, 2.0, 3.0, 4.0), bf(3.0, 4.0, 5.0, 6.0), bf(10.0, 20.0), bf(30.0, 40.0)
    a, b = (a0.float() + a1.float()) / 2, (b0.float() + b1.float()) / 2          # [2, 3, 4, 5], [20, 30]
    res = lambda r0, r1: [{"grads": {0: a0, 1: b0}, "shards": r0}, {"grads": {0: a1, 1: b1}, "shards": r1}]  # noqa: E731
    right = res({0: a[:2], 1: b[:1]}, {0: a[2:], 1: b[1:]})
    assert lab02_bf16.grade(right, ["a", "b"]) is None
    flat = torch.cat([a, b])
    bad = lab02_bf16.grade(res({0: flat[:2], 1: flat[2:3]}, {0: flat[3:5], 1: flat[5:]}), ["a", "b"])
    assert "first shard off the fp32 mean: a on rank 1" in bad and "not rank-major" in bad, bad
    nowhere = res({0: a[:2], 1: b[:1]}, {0: torch.tensor([7.0, -7.0]), 1: b[1:]})
    assert "fix the fp32 shard rows first" in lab02_bf16.grade(nowhere, ["a", "b"], fp32_wrong=True)
    assert "fp32 shard rows" not in lab02_bf16.grade(nowhere, ["a", "b"])


def test_a_layout_slip_is_named_on_the_bf16_row_too(monkeypatch):
    """Review r29 #3, on 2 real ranks: hooks packing param-major fail the fp32 shard row with "not
    rank-major", and the bf16 row (reduced in fp32 as asked) names the same fault, not the dtype."""
    report, _ = grade(monkeypatch, (1,), ("torch.cat(rows, dim=1).reshape(-1)", "torch.cat([r.reshape(-1) for r in rows])"))
    assert "not rank-major" in rows(report, "gradient shards")[0].detail, [r.detail for r in report.rows]
    bf16 = rows(report, "in bf16")
    assert bf16[0].status == "wrong" and "not rank-major" in bf16[0].detail, bf16


def test_bf16_reduced_in_bf16_and_copied_answers_fail_on_the_ranks(monkeypatch):
    """On 2 real ranks, no fp32 case (the bf16 case and Part 2's lone reduce-scatters only): hooks
    that reduce the bf16 bucket in bf16 and cast the shards afterwards are named by the values; a
    prediction that reads the planned answers from the grader's table is refused before any row
    (review r14: the grader's own formula imported as the answer passed all 6); a table typed out
    fails the run's drawn bucket sizes (tests/test_lab02_predict.py grades Part 2 by hand)."""
    copied = """def predict_exposed_seconds(sizes, bucket_bytes, lone):
    from gpumem.chapters.ch02_zero.lab02_predict import PLANS
    return next((p[3] for p in PLANS if list(p[0]) == list(sizes) and p[1] == bucket_bytes), 0.0)
"""
    report, seconds = grade(monkeypatch, (), ("g.reshape(-1).float()", "g.reshape(-1)"),
                            ("grad_shards[i] = shard\n", "grad_shards[i] = shard.float()\n"),
                            ("    ### END SOLUTION", "    ### END SOLUTION\n\n\n" + copied))
    bf16 = rows(report, "bf16")[0]
    assert bf16.status == "wrong" and "the bucket went over the wire in bf16" in bf16.detail
    run = [r for r in report.rows if r.function == "predict_exposed_seconds"]
    assert [r.status for r in run] == ["wrong"] and "it imports gpumem" in run[0].detail, run
    assert seconds < 60


def test_weights_allow_a_few_rounding_flips_not_a_wrong_step():
    """By hand, lr 3e-3 and 2 steps: one element of 2,000 off by 5e-3 (under 2 x lr x steps = 0.012;
    an Adam step flipped by a gradient at rounding level, review of drawn seeds: 1.29e-4 on mini) is
    allowed, as are 2 (0.1 % of 2,000); 3 are not, nor one off by 0.02, nor every element off by lr."""
    from gpumem.chapters.ch02_zero import lab02_weights
    want = torch.zeros(2000)

    def off(k: int, by: float):
        got = want.clone()
        got[:k] = by
        return lab02_weights.first_diverging(["w"], [want], [{"weights": [got]}], 3e-3, 2)
    assert off(1, 5e-3) is None and off(2, 5e-3) is None and off(2000, 5e-5) is None
    assert "3 of 2000 elements beyond 0.0001" in off(3, 5e-3)
    assert off(1, 0.02) and "first diverging tensor: w on rank 0" in off(2000, 3e-3)


def test_shards_keyed_by_the_parameter_are_told_the_key(monkeypatch):
    """Review r12 #3: chapter 02's ZeroAdamW keys its shards by the parameter; the lab keys them by
    index. Keyed by parameter, the row said a shard was missing and blamed the last bucket; it now
    names the key."""
    report, _ = grade(monkeypatch, (0,), ("            grad_shards[i] = shard\n",
                                          "            grad_shards[params[i]] = shard\n"))
    shards = rows(report, "gradient shards")
    assert shards[0].status == "wrong" and "keys must be each parameter's index" in shards[0].detail, shards[0].detail
    assert "Parameter keys" in shards[0].detail


# Review r12's cheats C and F, and the hang P. C rewrote the hold's clock through sys.modules, with
# every bucket blocking on the real handle: 26/26. F blocked on every bucket but the first of each
# pass, through the proxy's private slot: all 20 Part 1 rows. The versions below take the real
# handle from the grader's module (where it is kept now) with the static refusal switched off, to
# test what runs on the ranks: the seal (C) and the drawn hold (F).
# (before the fix the real work sat in the proxy's slot _h: this falls back to it, so that each test
# below fails on the grader of review r12 as it did, not on a missing name)
GRADER = "dist.reduce_scatter_tensor.func.__globals__"
REAL = (f"({GRADER}['_WORKS'][max({GRADER}['_WORKS'])] if '_WORKS' in {GRADER} "
        "else object.__getattribute__(work, '_h')[0])")
CLOCK = """    import sys, time as _time
    _ranks = sys.modules["gpumem.chapters.ch02_zero.lab02_ranks"]
    _rec, _me = _ranks._REC, dist.get_rank()

    class _Clock:
        sleep = staticmethod(_time.sleep)

        @staticmethod
        def monotonic():
            return _time.monotonic() + (5.0 if _rec.on and _rec.n_pass % 2 == _me else 0.0)
    _ranks.time = _Clock
"""
BEGIN = "    ### BEGIN SOLUTION\n"


def _unscanned(monkeypatch):
    """The static refusals off (the reach scan, and since review r35 the modules and names the hooks
    may use), to test the ranks' own checks behind them."""
    from gpumem.chapters.ch02_zero import lab02_bundle
    monkeypatch.setattr(labcheck, "first_reach", lambda source: None, raising=False)
    monkeypatch.setattr(lab02_bundle, "unweighed", lambda source: "")


def test_cheat_c_the_clock_rewritten_through_sys_modules_is_refused_before_it_runs(monkeypatch):
    _narrowed(monkeypatch)
    report = _lab02_with(_lab02_solution().replace(BEGIN, BEGIN + CLOCK))
    assert [(r.case, r.detail.split(";")[0]) for r in part1(report)] == [
        ("no reaching into the grader", "line 6: uses the attribute .modules")]


def test_cheat_c_a_grader_module_changed_on_the_ranks_fails_each_case(monkeypatch):
    """Past the static refusal, the ranks' seal sees lab02_ranks.time replaced at the first arrival:
    the case gets one row saying so, whatever the other rows would have said."""
    _unscanned(monkeypatch)
    report = grade_on(monkeypatch, ONE, (BEGIN, BEGIN + CLOCK), (LAUNCH, LAUNCH + f"        {REAL}.wait()\n"))
    assert [r.status for r in part1(report)] == ["wrong"] and len([r for r in part1(report) if "tiny" in r.case]) == 1
    assert [r for r in report.rows if r.function == labcheck.FN and "tiny, seed" in r.case] == part1(report)
    assert "the grader's module was changed (gpumem.chapters.ch02_zero.lab02_ranks.time was replaced)" in \
        part1(report)[0].detail


def test_cheat_f_every_bucket_but_the_first_blocking_is_measured(monkeypatch):
    """The held rank is held after a drawn k-th collective (k >= 1 on tiny's 21 buckets), so the
    collective tested is never the first; every later one blocks. F waited the real work, which
    the outputs' sentinel now names first (review r15, test_cheat_s2 below); here every bucket but
    the first blocks on the process group's own barrier, which writes no output: the hold alone
    measures it."""
    report = grade_on(monkeypatch, ONE,
                      ("bucket, in_flight, queued = [], [], [False]", "bucket, in_flight, queued, started = [], [], [False], [False]"),
                      (LAUNCH, LAUNCH + "        if started[0]:\n            dist.group.WORLD.barrier().wait()\n"
                                        "        started[0] = True\n"),
                      ("        queued[0] = False\n", "        queued[0] = False\n        started[0] = False\n"))
    _blocked(report, unseen=True)


def test_the_held_arrival_is_drawn_after_an_early_bucket_by_hand():
    """Tiny, bucket 0: 21 gradients, 20 sent before the last arrives, so k is drawn from 1 to 19.
    Sizes 100 x 6, bucket 150: sent at the 2nd and 4th (the 6th is the last): k = 1. Sizes 100 x 4:
    sent at the 2nd only: k = 0, the first arrival, as before."""
    import random

    from gpumem.chapters.ch02_zero import lab02_probe
    rng = random.Random(0)
    drawn = {lab02_probe.hold_after([4] * 21, 0, rng) for _ in range(400)}
    assert drawn == set(range(1, 20))
    assert {lab02_probe.hold_after([100] * 6, 150, rng) for _ in range(20)} == {1}
    assert lab02_probe.hold_after([100] * 4, 150, rng) == 0


def test_cheat_p_a_hook_that_never_returns_names_the_case_and_its_line():
    """Review r12 #5: spinning on the output tensor (gloo writes it only in wait()) never returns.
    The watchdog raises in the rank's main thread, naming the case and the learner's line (here in
    this process, 1 s: on the ranks the run then ends with that line as the rank's error)."""
    from gpumem.chapters.ch02_zero import lab02_probe
    source = "def hook(out):\n    while out.isnan().any():\n        pass\n"
    ns: dict = {}
    exec(compile(source, "<your install_zero2_hooks>", "exec"), ns)
    stop = lab02_probe.watchdog("rank 0, case tiny, seed 1, bucket 0 B", "<your install_zero2_hooks>", source, 1.0)
    start = time.monotonic()
    with pytest.raises(lab02_probe.Stuck) as stuck:
        ns["hook"](torch.full((4,), float("nan")))
    stop()
    assert time.monotonic() - start < 5
    assert str(stuck.value) == ("rank 0, case tiny, seed 1, bucket 0 B: still running after 1 s; it was at line 2 of "
                                "your function: while out.isnan().any():")


def test_cheat_p_on_the_ranks_ends_with_a_row_naming_the_case_and_the_line(monkeypatch):
    """The same on 2 ranks, with a 6 s watchdog: every bucket after the first of a pass spins on its
    output (no handle touched, no grader internals). It hung for the check's 480 s with a row naming
    nothing; now the run ends at the watchdog, its row naming the case and the spinning line."""
    from gpumem.chapters.ch02_zero import lab02_probe
    monkeypatch.setattr(lab02_probe, "WATCH_S", 6.0)        # the tiny case runs in well under a second
    start = time.monotonic()
    report = grade_on(monkeypatch, ONE,
                      ("bucket, in_flight, queued = [], [], [False]", "bucket, in_flight, queued, started = [], [], [False], [False]"),
                      ("        mine = torch.empty(sum(chunks), dtype=send.dtype, device=send.device)\n",
                       "        mine = torch.full((sum(chunks),), float('nan'), dtype=send.dtype)\n"),
                      (LAUNCH, LAUNCH + "        if started[0]:\n            while mine.isnan().any():\n                pass\n"
                                        "        started[0] = True\n"),
                      ("        queued[0] = False\n", "        queued[0] = False\n        started[0] = False\n"))
    row = part1(report)[0]
    assert row.status == "error" and "case tiny, seed" in row.detail and "bucket 0 B: still running after 6 s" in \
        row.detail and "of your function: while mine.isnan().any():" in row.detail, row.detail
    assert time.monotonic() - start < 60


def test_the_bf16_case_is_watched(monkeypatch):
    """Review r12 #6: the bf16 case ran with no record, meter or hold. Every bucket in flight at once
    (its fp32 flat copies add up to the gradients again) passed its row; now it is named."""
    report, _ = grade(monkeypatch, (), (CAP, ""))
    bf16 = rows(report, "bf16")[0]
    assert bf16.status == "wrong" and ("your hooks kept" in bf16.detail or "in flight at once" in bf16.detail), bf16
    # review r33 #2: the row's case reads "shards reduced in fp32": its detail says first that those were right
    assert bf16.detail.startswith("the shards are the fp32 mean; ") and bf16.case.endswith("then bytes and overlap")


# Review r15's cheats: S2 waited every bucket's real work at launch whenever the peer had launched it
# too (seen in the default store), so the hold never saw it block; MX switched the memory meter off
# from a hook and kept every flat copy. Both passed 27/27 in a real kernel; both are measured now.
S2_SETUP = """    import weakref
    store, me = next(iter(dist.distributed_c10d._world.pg_map.values()))[1], dist.get_rank()
    install_zero2_hooks.calls = getattr(install_zero2_hooks, "calls", 0) + 1
    count, hoard = [0], []
"""
# the reviewer's route first (a finalizer's bound _WORKS.pop returned the real work); where it
# hands out nothing, as now, the grader's module itself (the static refusal is off in the test)
S2 = """        count[0] += 1
        tag = f"s2/{install_zero2_hooks.calls}/{count[0]}/"
        store.set(tag + str(me), "1")
        if store.check([tag + str(1 - me)]):          # the peer launched it too: block on it now
            pops = [f.peek() for f in weakref.finalize._select_for_exit()]
            pops = [i for i in pops if i and getattr(i[1], "__name__", "") == "pop" and i[2] and type(i[2][0]) is int]
            real = max(pops, key=lambda i: i[2][0])[1](max(i[2][0] for i in pops), None) if pops else None
            if real is None:
                grader = dist.reduce_scatter_tensor.func.__globals__["_WORKS"]
                real = grader[max(grader)]
            real.wait()
"""
PAUSED = "torch.utils._python_dispatch._get_current_dispatch_mode_stack()"
MX_TRANSIENT = f"""bucket_bytes:
            for m in {PAUSED}:
                m.paused = True
            try:
                flush()
            finally:
                for m in {PAUSED}:
                    m.paused = False
"""


def test_no_finalizer_hands_out_the_real_work():
    """Review r15 #1: ``weakref.finalize._select_for_exit()`` -> ``peek()`` gave a proxy's finalizer,
    ``_WORKS.pop``, and calling it returned the real work. It is a function that returns nothing."""
    import weakref

    from gpumem.chapters.ch02_zero import lab02_watch
    proxy, real = lab02_watch.Work(10**9 + 1), object()
    lab02_watch._WORKS[10**9 + 1] = real
    mine = [f.peek() for f in weakref.finalize._select_for_exit() if f.peek() and f.peek()[0] is proxy]
    assert len(mine) == 1
    _, fn, args, kwargs = mine[0]
    assert fn(*args, **kwargs) is None and 10**9 + 1 not in lab02_watch._WORKS


def test_cheat_s2_waiting_the_real_work_when_the_peer_is_there_and_pausing_the_meter_are_measured(monkeypatch):
    """S2: every bucket's real work waited at launch when the peer has launched it too (so never
    while the peer is held: the hold sees overlap). The output, NaN at launch, holds the reduced
    values at the next arrival while its proxy was never used: the overlap row says so. Together
    with it, MX's pause made transient (on while the hook flushes, off before it returns, so no
    arrival sees it) and every flat copy kept: the reachability scan no longer skips storages made
    while the meter was paused, and the copies (500,992 B a pass) exceed the bound (447,440 B)."""
    _unscanned(monkeypatch)
    report = grade_on(monkeypatch, ONE, (BEGIN, BEGIN + S2_SETUP), (LAUNCH, LAUNCH + S2),
                      ("    def land(work, send, mine, which, chunks):\n        work.wait()\n",
                       "    def land(work, send, mine, which, chunks):\n        try:\n            work.wait()\n"
                       "        except AttributeError:\n            pass\n"),
                      ("        send = torch.cat(rows, dim=1).reshape(-1)\n",
                       "        send = torch.cat(rows, dim=1).reshape(-1)\n        hoard.append(send)\n"),
                      ("bucket_bytes:\n            flush()\n", MX_TRANSIENT))
    assert [r.case.split(": ")[1] for r in part1(report)] == ["peak full-gradient bytes during backward",
                                                             "async reduce-scatters overlapped with backward"]
    peak, overlap = (r.detail for r in part1(report))
    assert "your hooks kept" in peak and int(peak.split("kept ")[1].split(" B")[0].replace(",", "")) >= 500_992
    assert "output landed before you waited its handle" in overlap and "waited the real work" in overlap


MX = bytes.fromhex("666f72206d20696e20746f7263682e7574696c732e5f707974686f6e5f64697370617463682e5f6765745f63757272"
                   "656e745f64697370617463685f6d6f64655f737461636b28293a0a202020206d2e706175736564203d20547275650a")


def test_cheat_mx_the_meter_paused_from_a_hook_fails_the_case(monkeypatch):
    """MX as the reviewer wrote it (``timeit.Timer`` runs a string decoded at run time that sets
    ``paused`` on the dispatch-mode stack; the static refusal is off, to test what runs on the
    ranks), with every flat copy kept: the next arrival finds the meter paused outside a
    collective, and the case gets one row saying so."""
    _unscanned(monkeypatch)
    assert MX.decode() == f"for m in {PAUSED}:\n    m.paused = True\n"
    report = grade_on(monkeypatch, ONE,
                      (BEGIN, BEGIN + f"    import timeit\n    hoard, pause = [], bytes.fromhex({MX.hex()!r}).decode()\n"),
                      ("        send = torch.cat(rows, dim=1).reshape(-1)\n",
                       "        send = torch.cat(rows, dim=1).reshape(-1)\n        hoard.append(send)\n"),
                      ("            queued[0] = True\n",
                       "            queued[0] = True\n            timeit.Timer(pause, globals={'torch': torch}).timeit(1)\n"))
    tiny = [r for r in report.rows if r.function == labcheck.FN and "tiny, seed" in r.case]
    assert [r.status for r in tiny] == ["wrong"] and tiny == part1(report), tiny
    assert "the grader's memory meter was paused at gradient arrival 2 of backward 1 on rank" in tiny[0].detail
    bf16 = rows(report, "bf16")[0]
    assert bf16.status == "wrong" and "memory meter was paused" in bf16.detail, bf16


def test_review_r21_a_launch_into_a_tensor_subclass_is_refused():
    """Review r21: a subclass defined inside the hook answered the grader's NaN check with its own
    ``isnan``; a collective's output that is not a plain tensor is refused at its launch."""
    import torch
    from gpumem.chapters.ch02_zero import lab02_watch

    class Quiet(torch.Tensor):
        def isnan(self):
            return torch.ones(self.shape, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="output is a Quiet: use plain tensors"):
        lab02_watch._sentinel(torch.zeros(4).as_subclass(Quiet))
    assert lab02_watch._sentinel(torch.zeros(4)) is not None


def test_review_r24_the_list_form_is_told_to_use_one_flat_tensor(monkeypatch):
    """Review r24: dist.reduce_scatter's list form, waited only through its handle, was accused of
    waiting the real work: on gloo it fills its output before wait() (the reviewer's stand-alone
    probe: 3.0 before wait against -1.0 for the tensor form). The row now names the list form."""
    report, _ = grade(monkeypatch, (0,), (LAUNCH, "        work = dist.reduce_scatter(mine, list(send.view(world, -1)"
                                                  ".unbind(0)), async_op=True)\n"))
    bad = [r for r in report.problems if "overlapped" in r.case]
    assert bad and "list form fills its output" in bad[0].detail, report.summary()


def test_review_r27_a_case_the_probe_could_not_time_runs_once_more(monkeypatch):
    """Review r27: an honest design failed the overlap row once in 4 gradings at load 0.74 (the
    probe timed no pass on a rank: "the machine was too busy"), and passed the next check. Such a case
    now runs once more on the ranks before its rows are graded; here the first probe reading is made
    busy, and the solution's rows all pass after the second run."""
    from gpumem.chapters.ch02_zero import lab02_probe
    from gpumem.runs import launch
    real_overlap, real_run, launched, busy = lab02_probe.grade_overlap, launch.run, [], []

    def busy_once(ranks):
        if not busy:
            busy.append(True)
            return f"the grader could not test overlap on rank 1 in any pass (...): {lab02_probe.BUSY}: run it again"
        return real_overlap(ranks)

    def run(*args, **kwargs):
        launched.append((len(kwargs["cases"]), kwargs["lone_rounds"]))
        return real_run(*args, **kwargs)
    monkeypatch.setattr(lab02_probe, "grade_overlap", busy_once)
    monkeypatch.setattr(launch, "run", run)
    report, _ = grade(monkeypatch, (0,))
    hooks = [r for r in report.rows if r.function == labcheck.FN]
    assert launched == [(1, 1), (1, 1)] and busy and hooks and all(r.status == "ok" for r in hooks), report.rows


STORE = """
def install_zero2_hooks(params, grad_shards, bucket_bytes):
    # every gradient is copied into one whole-model fp32 store made here, before training, and written
    # with numpy during backward: ZeRO-1's memory (all gradients, kept across passes)
    world = dist.get_world_size()
    where = {id(p): i for i, p in enumerate(params)}
    offs, total = [], 0
    for p in params:
        offs.append(total)
        total += p.numel()
    store = torch.zeros(total, dtype=torch.float32)
    store_np = store.numpy()
    state = {"bucket": [], "bytes": 0, "flying": [], "armed": False}

    def finish(entry):
        work, flat, out, idx, sizes = entry
        work.wait()
        out.div_(world)
        off = 0
        for i, n in zip(idx, sizes):
            grad_shards[i] = out[off:off + n]
            off += n

    def send():
        if len(state["flying"]) >= 2:
            finish(state["flying"].pop(0))
        idx = state["bucket"]
        sizes = [math.ceil(params[i].numel() / world) for i in idx]
        parts = []
        for i, n in zip(idx, sizes):
            g = store[offs[i]:offs[i] + params[i].numel()]
            parts.append(torch.cat([g, g.new_zeros(n * world - g.numel())]).view(world, n))
        flat = torch.cat(parts, dim=1).reshape(-1)
        del parts
        out = torch.empty(sum(sizes), dtype=torch.float32)
        work = dist.reduce_scatter_single(out, flat, async_op=True)
        state["flying"].append((work, flat, out, list(idx), sizes))
        state["bucket"], state["bytes"] = [], 0

    def on_end():
        if state["bucket"]:
            send()
        while state["flying"]:
            finish(state["flying"].pop(0))
        state["armed"] = False

    def hook(p):
        if not state["armed"]:
            state["armed"] = True
            torch.autograd.Variable._execution_engine.queue_callback(on_end)
        i = where[id(p)]
        g = p.grad.detach()
        if g.dtype != torch.float32:
            g = g.float()
        store_np[offs[i]:offs[i] + p.numel()] = g.reshape(-1).numpy()
        state["bytes"] += p.grad.numel() * p.grad.element_size()
        p.grad = None
        del g
        state["bucket"].append(i)
        if state["bytes"] >= bucket_bytes:
            send()

    for p in params:
        p.register_post_accumulate_grad_hook(hook)

"""


def test_review_r29_a_gradient_store_made_at_install_counts(monkeypatch):
    """Review r29 (27/27): install_zero2_hooks made a whole-model fp32 store and the hooks wrote each
    gradient into it through numpy (unseen by the dispatch mode), then packed buckets from its slices:
    ZeRO-1's gradient memory, kept across passes. What the install call makes and keeps now counts in
    every sample of the bytes held."""
    _narrowed(monkeypatch)
    monkeypatch.setattr(labcheck, "CASES", labcheck.CASES[:1])
    rows = [r for r in _lab02_with(STORE).rows if "peak full-gradient bytes" in r.case]
    assert rows and rows[0].status == "wrong" and "or by the install call and kept" in rows[0].detail, rows


STORE_BYTES = (STORE.replace("    store = torch.zeros(total, dtype=torch.float32)\n    store_np = store.numpy()\n",
                             "    raw = bytearray(4 * total)\n\n    def view(a, b):\n"
                             "        return torch.frombuffer(raw, dtype=torch.float32, count=b - a, offset=4 * a)\n")
               .replace("g = store[offs[i]:offs[i] + params[i].numel()]", "g = view(offs[i], offs[i] + params[i].numel())")
               .replace("store_np[offs[i]:offs[i] + p.numel()] = g.reshape(-1).numpy()",
                        "view(offs[i], offs[i] + p.numel()).copy_(g.reshape(-1))"))


def test_review_r31_a_gradient_store_made_as_a_bytearray_counts(monkeypatch):
    """Review r31 (27/27): the same whole-model store made as a bytearray at install and written through
    torch.frombuffer views (no torch storage outlives a line, so neither meter saw it). The install
    call is traced by tracemalloc now: on mini (3,346,944 B of gradients) the store is far over the
    slack, and the peak row fails."""
    assert "bytearray" in STORE_BYTES and "store_np" not in STORE_BYTES
    _narrowed(monkeypatch)
    monkeypatch.setattr(labcheck, "CASES", labcheck.CASES[1:2])
    rows = [r for r in _lab02_with(STORE_BYTES).rows if "peak full-gradient bytes" in r.case]
    assert rows and rows[0].status == "wrong" and "or by the install call and kept" in rows[0].detail, rows



@pytest.mark.parametrize("store", ["    import mmap\n    keep = mmap.mmap(-1, 1 << 20)\n",
                                   "    from multiprocessing import shared_memory\n"
                                   "    keep = shared_memory.SharedMemory(create=True, size=1 << 20)\n",
                                   "    import numpy as np\n    keep = np.memmap('/dev/zero', mode='r', shape=(1 << 20,))\n",
                                   # review r35: a store of torch.distributed's own, and mmap through a module that imports it
                                   "    kv = dist.HashStore()\n",
                                   "    kv = torch.distributed.distributed_c10d.FileStore('/tmp/x', 2)\n",
                                   "    kv = getattr(dist, 'TCPStore')\n",
                                   "    from rich.progress import mmap as M\n    keep = M(-1, 1 << 20)\n",
                                   "    from torch.distributed import PrefixStore\n",
                                   # review r37: a sparse tensor, an autograd node's saved result (27/27 each)
                                   "    keep = torch.zeros(1 << 10).to_sparse()\n",
                                   "    keep = torch.ones(1, requires_grad=True).exp().grad_fn._saved_result\n"],
                         ids=["mmap", "shared-memory", "numpy-memmap", "hashstore", "filestore", "getattr-store",
                              "re-exported-mmap", "imported-store", "sparse", "saved-result"])
def test_review_r33_a_store_in_memory_the_probe_cannot_weigh_is_refused(monkeypatch, store):
    """Review r33: hooks that wrote every gradient into an ``mmap.mmap(-1, ...)`` made at install,
    through ``torch.frombuffer`` views, passed 27/27: neither torch's allocator nor tracemalloc sees
    that memory. Memory from outside both is refused in the source, before a rank starts. Review r35:
    a ``dist.HashStore`` (C++ memory, 27/27) and mmap imported from a module that imports it (26/27)
    passed that list of names; the hooks may now import only torch and a few standard modules, and of
    torch.distributed only the collectives and what the lab's checks meet, no store."""
    source = _lab02_solution()
    head = "def install_zero2_hooks(params, grad_shards, bucket_bytes):\n"
    assert head in source
    _narrowed(monkeypatch)
    report = _lab02_with(source.replace(head, head + store, 1))
    row = next(r for r in report.rows if r.status != "ok")
    assert row.case == "gradients kept in torch" and "memory the grader cannot weigh" in row.detail, row
    first = store.splitlines()[0].strip()                    # review r35 #3: the line named by its text
    assert row.detail.startswith(f"line 2 of your function (`{first}`)"), row.detail      # r37 #3: and number
