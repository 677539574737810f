"""Lab 02's ``check()``: the learner's bucketed ZeRO-2 gradient hooks, run on 2 CPU ranks.

The learner writes ``install_zero2_hooks(params, grad_shards, bucket_bytes)`` with
``torch.distributed`` alone (no ``gpumem`` helpers). On each rank the grader builds a model, puts
a :class:`gpumem.runs.gradmeter.GradMeter` on it *first* (so it sees every gradient before the
learner's hooks can free it), installs the learner's hooks and trains with :func:`sharded_step`,
recording the collectives called during each backward. Graded per case, the seeds, bucket sizes
and the unused layer's place drawn afresh at every check from :data:`CASES` (:mod:`.lab02_cases`):

1. when ``backward()`` returns, ``grad_shards[i]`` is this rank's shard of the gradient averaged
   over ranks (against a single-process gradient on the whole batch) and no ``.grad`` is left:
   the last, partly filled bucket went out before backward returned;
2. the peak of full-gradient bytes alive during backward is at most the bucket plus the largest
   gradient, where ZeRO-1 would hold all of them; and every byte made during backward that the
   hooks keep (:class:`.lab02_meter.LiveMeter`: a copy of a gradient counts after ``.grad = None``;
   :class:`.lab02_probe.Reach` adds copies made with the dispatch modes off) is at most that, two
   flat copies in flight and the shards (:func:`.lab02_meter.held_bound`);
3. gradients leave by reduce-scatter (``reduce_scatter_single`` or its deprecated alias
   ``reduce_scatter_tensor``; no other collective), one per bucket, carrying every gradient that
   arrived once (padded), and gloo's own count of collectives agrees with what the wrappers saw (:mod:`.lab02_watch`);
4. the reduce-scatters overlap with backward: a full bucket's goes out from the hook that fills it
   with ``async_op=True`` and is waited later (not right after its launch, by ``wait()``, the
   handle behind the proxy or a barrier), two are in flight while backward runs and never more
   (each holds a flat copy until it is waited), every handle is waited
   before backward returns, and the end of the pass comes from a callback queued on autograd's
   engine (:mod:`.lab02_watch` records launches and waits against the order gradients arrive),
   so a parameter that gets no gradient (the unused layer of the last case) neither hangs the
   hooks nor keeps the last bucket back; and, measured whatever route blocks, no output (filled with
   NaN at launch) is written before its handle is used (gloo writes it in ``wait()``), and the other
   rank goes on computing gradients while one rank is held back at a gradient drawn per pass
   (:mod:`.lab02_probe`);
5. the weights after a few steps equal single-process ``torch.optim.AdamW``;

and on a bf16 model (one more drawn case, :mod:`.lab02_bf16`, watched as the others) the shards are
the ranks' bf16 gradients reduced in fp32, then its flat copies are bounded as fp32 copies, its
collectives and its overlap checked, in one row. Each row names the first thing that differs in it.
Before anything runs, a source that reaches into the grader (``sys.modules``, ``__globals__``,
``gc``...) is refused (:mod:`gpumem.course.lab_reach`); on the ranks, a change to the grader's
modules while the hooks ran, or the memory meter found paused outside a collective, fails the case
(``lab02_watch.seal``), and a case still running after
``lab02_probe.WATCH_S`` ends the run with a row naming the case and the learner's line. Part 2's
``predict_exposed_seconds`` is graded on planned numbers and on lone reduce-scatters the same
ranks timed (:mod:`.lab02_predict`; the grader's own count refuses meanwhile,
:mod:`.lab02_guard`). The optional GPU part
(:mod:`.lab02_gpu`) runs once the hooks are right and 2 GPUs are here; otherwise ``check()``
prints "GPU part: skipped (reason)" and adds no row.
"""

import ast
import math

from gpumem.course.grading import Report, Row, case_seconds, failure_line, kind, run_case
from gpumem.course import lab_bare
from gpumem.course.lab_reach import first_reach
from gpumem.errors import RunFailure

from . import lab02_bf16, lab02_bundle, lab02_cases, lab02_measure, lab02_predict, lab02_probe, lab02_weights
from .lab02_bundle import gpumem_imports
from .lab02_gpu import GPU_ATOL  # noqa: F401 (tests read it here)
from .lab02_ranks import (BARRIERS, FN, REDUCE_SCATTERS, build, reference,  # noqa: F401 (lab prints sharded_step)
                          grad_bytes, sharded_step)

LAB = "lab02_zero2_hooks"
# (model, seed, steps, bucket_bytes, an unused layer's parameters in the list): roles of the graded cases;
# each check draws seeds, buckets, the spare layer's places from them (lab02_cases); "odd": a shape no chapter
# uses, its bucket divides no gradient evenly
CASES = (("tiny", 3, 3, 0, False), ("mini", 5, 2, 200_000, False), ("tiny", 7, 2, 10**7, False),
         ("odd", 11, 3, 150_001, True))
IN_FLIGHT = 2                      # this lab's cap (a choice): one bucket on the wire while the next one goes out
LONE_ROUNDS = lab02_measure.ROUNDS  # Part 2's lone reduce-scatters (tests that read no Part 2 row take 1)


def check(ns: dict, show: bool = True) -> Report:
    """Grade Part 1's hooks on 2 CPU ranks (each row names its first mismatch), then Part 2's prediction;
    once the hooks are right, the optional GPU part runs with 2 GPUs, else a printed line says why
    it is skipped (no row). Never raises: an unsolved lab reports what is left."""
    report, (cases, bf16), lone = Report(LAB), lab02_cases.draw(CASES), []
    fn = ns.get(FN)
    source, problem = _source_of(fn, FN, "params, grad_shards, bucket_bytes") if fn is not None else (None, "")
    sent = lab02_bundle.bundle(fn, ns, source) if source and not problem else source   # with its helpers
    if problem:
        report.rows.append(Row(FN, "2 CPU ranks", "error", problem))
    elif fn is None or 'NotImplementedError("TODO' in source:
        report.rows.append(Row(FN, "2 CPU ranks", "todo", f"{FN} is still to write"))
    elif gpumem_imports(sent):
        report.rows.append(Row(FN, "torch.distributed only", "wrong",
                               f"it imports {gpumem_imports(sent)[0]}: write the padding, the layout and "
                               "the reduce-scatter with torch.distributed yourself"))
    elif lab02_bundle.unweighed(sent):                 # review r33: a store in an mmap, never weighed
        report.rows.append(Row(FN, "gradients kept in torch", "wrong", lab02_bundle.unweighed(sent)))
    elif first_reach(source) or first_reach(sent):     # r12 #1: the grader's clock and handles, reached into
        report.rows.append(Row(FN, "no reaching into the grader", "wrong", first_reach(source) or first_reach(sent)))
    else:
        def body():
            from gpumem.runs import launch

            def ranks_of(these, rounds=LONE_ROUNDS):
                return launch.run("gpumem.chapters.ch02_zero.lab02_ranks:lab02_rank", 2, progress=False,
                                  results="plain", source=sent, cases=these, bf16=bf16, watch_s=lab02_probe.WATCH_S,
                                  lone_rounds=rounds)
            try:                                 # the learner's code runs on the ranks
                ranks = lab02_probe.again(ranks_of(cases), cases, lambda these: ranks_of(these, 1),
                                          [lab02_probe.several(grad_bytes(c[0]), c[3]) for c in cases])
            except (launch.RankError, RunFailure) as err:      # a case stuck: lab02_probe.watchdog names it
                return "error", (failure_line(err).replace(f"{lab02_probe.__name__}.Stuck: ", "")
                                 + lab02_bundle.where(getattr(err, "detail", ""), sent))
            for k, case in enumerate(cases):
                run_case(report, FN, _label(case, 2), lambda: _grade_case(report, case, [r[k] for r in ranks]))
            extra = [r[-1] for r in ranks]
            lone.append(extra[0]["lone"])
            shards_wrong = any(r.status == "wrong" and r.case.endswith("gradient shards when backward returns")
                               for r in report.rows)
            report.rows.append(Row(FN, lab02_bf16.label(bf16, 2), *_bf16_row([x["bf16"] for x in extra], bf16, shards_wrong)))
        run_case(report, FN, "2 CPU ranks", body, case_seconds(cases=max(len(CASES), 1)))
    hooks_ok = report.solved
    lab02_predict.grade(report, ns.get(lab02_predict.PREDICT), lone[0] if lone else None)
    from . import lab02_gpu
    gpu_line = lab02_gpu.grade(report, sent) if hooks_ok else "not run: Part 1's hooks are not right yet"
    if show:
        print(report.summary())
        print(f"GPU part: {gpu_line}")
    return report


def _source_of(fn, name: str, args: str) -> tuple[str, str]:
    """(source, problem): the learner's function as text that can run elsewhere, or why it cannot."""
    import textwrap
    if not callable(fn):
        return "", f"{name} is {kind(fn)}, not a function"
    try:
        source = textwrap.dedent(lab_bare.source(fn))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return "", "could not read the function's source (define it in a notebook cell)"
    if not any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body):
        return "", f"define it as `def {name}({args}):` in a cell (it runs from that source)"
    return source, ""


def _label(case: tuple, world: int) -> str:
    model, seed, steps, bucket, spare = case
    at = f" + unused layer at {spare[0]} and {spare[1]}" if isinstance(spare, tuple) else \
        " + unused layer" * bool(spare)
    return f"{model}{at}, seed {seed}, bucket {bucket:,} B, {world} ranks"


def _grade_calls(ranks: list[dict], n_tensors: int, total: int, bucket: int) -> str | None:
    """Every collective the process group ran went through torch.distributed's functions; gradients
    leave by reduce-scatter only, one collective per bucket, carrying every gradient once."""
    most = 1 if bucket >= total else n_tensors if bucket == 0 else min(n_tensors, 2 * math.ceil(total / bucket) + 1)
    for r, res in enumerate(ranks):
        for n, p in enumerate(res["passes"], 1):
            if p["seq_ops"] != p["ops"]:
                return (f"in backward {n} rank {r}'s process group ran {p['seq_ops']} collective operation(s) "
                        f"(gloo's own count), the grader saw {p['ops']} go through torch.distributed's functions: "
                        "a collective went around them (a ProcessGroup method, a saved original) or the grader's "
                        "record was edited; call dist.reduce_scatter_single itself")
            calls = p["calls"]
            other = {k: v for k, v in calls.items() if k not in REDUCE_SCATTERS}
            if other:
                name = next(iter(other))
                if name in BARRIERS:
                    return (f"backward called dist.{name}() {other[name]} time(s): it waits every reduce-scatter "
                            "in flight, so nothing overlaps; wait your own handles instead")
                return (f"backward called {name} {other[name]} time(s): only reduce-scatters are needed "
                        "(an all-reduce moves twice the bytes)")
            rs = sum(calls.values())
            if rs == 0:
                return "no reduce-scatter ran during backward"
            if rs > most:
                return (f"{rs} reduce-scatters in one backward; with a {bucket:,}-byte bucket and {total:,} bytes "
                        f"of gradients at most {most} (one collective per bucket)")
            sent = sum(x["sent"] for x in p["launches"])
            if sent != p["need"]:
                return (f"in backward {n} rank {r}'s reduce-scatters sent {sent:,} elements; the gradients that "
                        f"arrived, each padded to a multiple of {len(ranks)}, are {p['need']:,}: "
                        + ("part of them went some other way, or not at all" if sent < p["need"] else
                           "send each gradient once, padded to a multiple of the ranks and no more"))
    return None


def _grade_overlap(ranks: list[dict], several: bool) -> str | None:
    """Full buckets go out from the hooks with ``async_op=True`` and are waited later, before
    backward returns; the end of the pass comes from a callback queued on autograd's engine.
    ``several``: the bucket fills before the last gradient arrives."""
    for res in ranks:
        for n, p in enumerate(res["passes"], 1):
            last = p["arrivals"]                # launched at arrival k < last: later gradients still to come
            early = [x for x in p["launches"] if x["at"] < last]
            if not p["queued"] and any(q["queued"] for q in res["passes"][:n - 1]):
                return (f"backward {n} queued no callback on autograd's engine, an earlier one did: a queued "
                        "callback runs once, when that backward ends, and is then cleared; queue one in every pass")
            if not p["queued"]:
                return (f"backward {n} queued no callback on autograd's engine (the grader watches its queue): how "
                        "do your hooks know the pass is over? A count of arrivals breaks when a parameter gets no "
                        "gradient")
            sync = next((x for x in early if not x["async"]), None)
            if sync:
                return (f"dist.{sync['name']} ran with async_op=False inside a gradient hook: backward stopped "
                        "until it finished; launch the bucket's reduce-scatter with async_op=True, keep the handle")
            if p.get("early"):                 # review r15 #1: measured, whatever route reached the work
                k, at = p["early"]
                if any(x["name"] == "reduce_scatter" for x in p["launches"]):     # review r24
                    return (f"bucket {k}'s output landed before you waited its handle: dist.reduce_scatter's list "
                            "form fills its output on gloo's thread before wait(), so the grader cannot see the "
                            "overlap; launch each bucket with reduce_scatter_single (one flat tensor)")
                return (f"bucket {k}'s output landed before you waited its handle (by gradient arrival {at} of "
                        f"backward {n}; gloo writes it only in wait()): something waited the real work, or wrote "
                        "into the output while it was in flight; wait only the handle dist returned")
            if any(x["async"] and x["waited"] is None for x in p["launches"]):
                return ("a reduce-scatter's work handle was never waited before backward returned: its shard "
                        "may not have arrived; wait every handle in the end-of-backward callback")
            most = max((_in_flight(p["launches"], x) for x in p["launches"]), default=0)
            if most > IN_FLIGHT:
                return (f"{most} buckets were in flight at once: each holds its flat copy until it is waited, "
                        f"so they add up to the gradients again; cell 0 allows two")
            soon = next((x for x in early if x["waited"] == x["at"]), None)
            if soon:
                return (f"a reduce-scatter was waited right after its launch (by {soon['how']}), before the next "
                        f"gradient arrived: nothing overlapped; a bucket should travel while backward goes on")
            if several and not early:
                return ("every reduce-scatter started after the last gradient had arrived: nothing overlapped "
                        "with backward; send each full bucket from the hook that fills it")
            during = max((_in_flight(p["launches"], x) for x in early), default=0)
            if len(early) >= IN_FLIGHT and during < IN_FLIGHT:
                return (f"{len(early)} reduce-scatters went out during backward but never {IN_FLIGHT} in flight at "
                        f"once: each was waited before the next launch; keep {IN_FLIGHT} in flight")
    return lab02_probe.grade_overlap(ranks) if several else None    # measured: whatever route blocked


def _in_flight(launches: list[dict], x: dict) -> int:
    """Asynchronous reduce-scatters launched up to ``x`` (included) and not waited before it."""
    return sum(1 for y in launches if y["async"] and y["t"] <= x["t"] and (y["t_wait"] or 1e9) > x["t"])


def _changed(ranks: list[dict]) -> str | None:
    """The first rank on which the grader's modules were changed while the hooks ran (review r12 #1),
    or its memory meter was found paused outside a collective (r15 #2)."""
    for r, res in enumerate(ranks):
        if res.get("changed"):
            return f"the grader's module was changed ({res['changed']}) on rank {r} while your hooks ran: " \
                   "the case is not graded"
        if res.get("paused"):
            return (f"the grader's memory meter was paused at {res['paused']} on rank {r}, outside any "
                    "collective (it pauses only while one runs): your hooks switched it off; the case is not graded")
    return None


def _bf16_row(ranks: list[dict], case: tuple, fp32_wrong: bool = False) -> tuple[str, str]:
    """The bf16 case's row: the values (fp32 mean), then, watched as the fp32 cases are, the bytes the
    hooks keep (their flat copies are fp32: the bound of an fp32 model with the same elements), the
    collectives and the overlap."""
    model, seed, _, bucket = case
    status, detail = lab02_bf16.row(ranks, reference(model, seed, 1, 2, False)["names"], fp32_wrong)
    if status != "ok" or _changed(ranks):
        return (status, detail) if status != "ok" else ("wrong", _changed(ranks))
    from .lab02_meter import grade_peak, held_bound
    net, names, params = build(model, seed, False)
    numel = [p.numel() for p in params]
    bad = (grade_peak(ranks, [2 * n for n in numel], names, bucket, len(ranks),
                      most=held_bound([4 * n for n in numel], 2 * bucket, len(ranks)))
           or _grade_calls(ranks, len(numel), 2 * sum(numel), bucket)
           or _grade_overlap(ranks, 2 * (sum(numel) - max(numel)) >= bucket))
    return ("wrong", f"the shards are the fp32 mean; {bad}") if bad else ("ok", "")    # review r33 #2


def _grade_case(report: Report, case: tuple, ranks: list[dict]) -> None:
    model, seed, steps, bucket, spare = case
    world, label = len(ranks), _label(case, len(ranks))
    failed = next((f"rank {r}: {res['error']}" for r, res in enumerate(ranks) if "error" in res), None)
    if failed:
        return report.rows.append(Row(FN, label, "error", f"your hooks raised, {failed}"))
    if _changed(ranks):
        return report.rows.append(Row(FN, label, "wrong", _changed(ranks)))
    ref = reference(model, seed, steps, world, spare)
    names = ref["names"]
    bad = lab02_weights.grade_shards(ranks, ref, world)
    report.rows.append(Row(FN, f"{label}: gradient shards when backward returns", "wrong" if bad else "ok",
                           bad or ""))
    sizes = [4 * g.numel() if g is not None else 0 for g in ref["grads"]]
    from .lab02_meter import grade_peak
    detail = grade_peak(ranks, sizes, names, bucket, world)
    report.rows.append(Row(FN, f"{label}: peak full-gradient bytes during backward", "wrong" if detail else "ok",
                           detail or ""))
    bad = _grade_calls(ranks, sum(s > 0 for s in sizes), sum(sizes), bucket)
    report.rows.append(Row(FN, f"{label}: collectives during backward", "wrong" if bad else "ok", bad or ""))
    bad = _grade_overlap(ranks, lab02_probe.several(sizes, bucket))
    report.rows.append(Row(FN, f"{label}: async reduce-scatters overlapped with backward",
                           "wrong" if bad else "ok", bad or ""))
    from gpumem.runs.training import HYPER
    bad = lab02_weights.first_diverging(names, ref["weights"], ranks, HYPER["lr"], steps)
    report.rows.append(Row(FN, f"{label}: weights after {steps} steps vs torch AdamW", "wrong" if bad else "ok",
                           bad or ""))
