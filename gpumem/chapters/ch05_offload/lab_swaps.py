"""Lab 05's part 2, graded: the swap files one rank writes under ZeRO-3 with optimizer and parameters
on NVMe, against DeepSpeed itself.

With libaio (:func:`gpumem.runs.ds_offload.nvme_ready`) each check draws two unseen models
(:func:`draw_models`: one of each of :data:`FAMILY`'s kinds, width, MLP and vocabulary drawn from
ranges), trains them one step on two CPU ranks (:func:`.lab_runs.swap_run`) and compares with the
files on disk. Without it, it draws two of :data:`FAMILY`'s six recorded models and compares with
the counts and digests of their recorded run (:mod:`.lab_swap_record`), and says so in the row. No
rule for the file sizes ships here: the hand count that tests check the record and the kinds
against lives in ``tests/test_lab05_adversarial.py``.

Known gap (review r9): the recorded digests and :func:`digest` are importable, so a learner can
test candidate sizes against them offline, as often as they like, with no message. A digest
gives no size back, so a rule is still needed to produce the candidates; any coarser record that
could say which way a size is off (its MiB, its KiB) would give the padded sizes away, so the
recorded path names the rules to check instead of a direction.
"""

import contextlib
import hashlib
import inspect
import os
import types

from gpumem.course import seeds
from gpumem import scratch
from gpumem.course.copy_watch import fresh, is_own
from gpumem.course.grading import Report, Row, call, case_seconds, failure_line, returned, run_case
from gpumem.errors import RunFailure
from gpumem.memory.models import ModelConfig
from gpumem.runs import ds_offload, launch, rank_guard

from . import lab_guard, lab_swap_record
from . import lab_reference as ref

# the kinds of model a check draws (:func:`draw_model`), and six recorded members (:mod:`.lab_swap_record`),
# trained one step on 2 CPU ranks. Kind A (1 MiB aio blocks): the embedding and head shards reach 1 MiB in bf16
# at a length that is not a multiple of 1,024 B (padded files); the MLP shards reach it only in fp32
# (gradients swapped, parameters kept in RAM). Kind B (2 MiB blocks): the bf16 shards stay under the
# block (in RAM, though over 1 MiB), the embedding's fp32 gradient is cut to an aligned length and
# the MLP gradients (1-2 MiB) stay in RAM.
FAMILY = {"A": [ModelConfig(f"lab05-a{i}", 1, d, 4, 2, f, v, teaching=True) for i, (d, f, v) in
                enumerate([(352, 1792, 3203), (448, 1600, 3001), (256, 2240, 5003)])],
          "B": [ModelConfig(f"lab05-b{i}", 1, d, 4, 2, f, v, teaching=True) for i, (d, f, v) in
                enumerate([(416, 2176, 4001), (320, 1792, 5501), (288, 2368, 5501)])]}
BLOCKS = {"A": 1 << 20, "B": 2 << 20}
SWAP_KINDS = {"params": "params", "fp32 master": "master", "moments": "optimizer", "grads": "grads"}


def model_label(cfg: ModelConfig) -> str:
    """The row's name of a model: its kind, width and aio block."""
    kind = cfg.name[len("lab05-")].upper()
    if cfg.name[-2:-1].isalpha():                       # one of FAMILY's recorded models
        return f"model {kind}{cfg.name[-1]} ({cfg.d_model} wide), {BLOCKS[kind] >> 20} MiB aio blocks"
    return f"model {kind} ({cfg.d_model} wide, MLP {cfg.ffn}, vocab {cfg.vocab}), {BLOCKS[kind] >> 20} MiB aio blocks"


def family() -> dict:
    """Every model a check may draw: label -> (ModelConfig, block bytes)."""
    return {model_label(c): (c, BLOCKS[kind]) for kind, cfgs in FAMILY.items() for c in cfgs}


def _kind_ok(kind: str, d: int, f: int, v: int) -> bool:
    """Whether a model of width ``d``, MLP ``f`` and vocabulary ``v`` is of ``kind`` (:data:`FAMILY`'s
    comment): A, bf16 embedding shards over 1 MiB at an unaligned length, MLP shards over it only
    in fp32; B, bf16 embedding shards between 1 and 2 MiB, its fp32 gradient unaligned, fp32 MLP
    shards between 1 and 2 MiB (2 ranks)."""
    emb, mlp, mib = -(-v * d // 2), -(-d * f // 2), 1 << 20
    if kind == "A":
        return 2 * emb >= mib and (2 * emb) % 1024 != 0 and 2 * mlp < mib <= 4 * mlp
    return mib <= 2 * emb < 2 * mib and (4 * emb) % 1024 != 0 and mib <= 4 * mlp < 2 * mib


def draw_model(rng, kind: str) -> ModelConfig:
    """A model of ``kind`` drawn from ranges (width 256-448 in steps of 32, MLP 1,536-2,560 in
    steps of 64, vocabulary 2,500-5,999), so that no table of models can hold the answers."""
    while True:
        d, f, v = 32 * rng.randint(8, 14), 64 * rng.randint(24, 40), rng.randrange(2500, 6000)
        if _kind_ok(kind, d, f, v):
            return ModelConfig(f"lab05-{kind.lower()}-{d}-{f}-{v}", 1, d, 4, 2, f, v, teaching=True)


def draw_models(rng) -> dict:
    """One model of each kind drawn from ranges (:func:`draw_model`), label -> (ModelConfig, block).
    The kinds are chosen so that leaving out any one of DeepSpeed's swap rules (the block and
    MIN_AIO_BYTES, the 1,024-byte padding, the aligned cut of gradient fragments, the flat fp32
    partition) changes the files of at least one of the two (tests check it by hand)."""
    return {model_label(c): (c, BLOCKS[k]) for k in FAMILY for c in [draw_model(rng, k)]}


def recorded_models(rng) -> dict:
    """One recorded model of each kind (:data:`FAMILY`, :mod:`.lab_swap_record`), drawn: the
    models graded where libaio is missing."""
    return {model_label(c): (c, BLOCKS[k]) for k in FAMILY for c in [rng.choice(FAMILY[k])]}


def numels(cfg: ModelConfig) -> list[int]:
    """The parameter sizes of ``cfg``'s Llama, in the model's order (built on the meta device)."""
    import torch
    from gpumem.memory.llama import Llama
    with torch.device("meta"):
        return [p.numel() for p in Llama(cfg).parameters()]


def swap_shape_problem(got) -> str:
    """'' if ``got`` is role -> list of whole byte counts, with the lab's roles only."""
    if not isinstance(got, dict) or not all(isinstance(v, (list, tuple)) for v in got.values()):
        return returned(got, "a dict role -> list of file sizes in bytes")
    bad = [k for k in got if k not in ref.ROLES]
    if bad:
        return f"unknown role {bad[0]!r}: the roles are {', '.join(ref.ROLES)}"
    sizes = [b for v in got.values() for b in v]
    odd = next((b for b in sizes if isinstance(b, bool) or not isinstance(b, int)), None)
    return f"file sizes are whole bytes (int), got {odd!r}" if odd is not None else ""


def by_role(files: dict[str, int]) -> dict[str, list[int]]:
    """DeepSpeed's files (name -> bytes) as role -> sizes."""
    want: dict[str, list[int]] = {}
    for name, size in files.items():
        want.setdefault(SWAP_KINDS[ds_offload._kind(name.rsplit("/", 1)[-1])], []).append(size)
    return want


def digest(label: str, role: str, sizes) -> str:
    """The recorded form of one role's file sizes (:mod:`.lab_swap_record`)."""
    return hashlib.sha256(f"{label}|{role}|{sorted(sizes)}".encode()).hexdigest()[:32]


# what decides each role's file sizes: the recorded path's pointer where it cannot give a direction
RULES = {"params": "which shards are large enough to be swapped (against the aio block) and their padding",
         "master": "whether the fp32 master copy is one flat partition or a file per tensor, and its padding",
         "optimizer": "how many moment files there are and their padding",
         "grads": "which fp32 gradient pieces are swapped and how their length is aligned"}


def recorded_problem(got, label: str) -> str:
    """:func:`swap_problem` against the recorded counts and digests: no direction (not recorded)."""
    for role in ("params", "master", "optimizer", "grads"):
        count, want = lab_swap_record.DIGESTS[label].get(role, (0, digest(label, role, [])))
        g = got.get(role, [])
        if len(g) != count:
            return f"{role}: DeepSpeed wrote {count} file(s), you predicted {len(g)}"
        if digest(label, role, g) != want:
            return (f"{role}: DeepSpeed wrote {count} file(s), as you predicted, but the sizes differ: check "
                    + RULES.get(role, "the block size") + " (the recorded run keeps a digest only: "
                    "a live run, with libaio, says which file and which way)")
    return ""


def swap_problem(got, files: dict[str, int]) -> str:
    """'' if ``got`` (role -> sizes) lists the sizes of ``files`` (DeepSpeed's name -> bytes) by role;
    else the first role that differs: the count of files, or a size's direction, never the sizes."""
    return role_problem(got, by_role(files))


def role_problem(got, want: dict[str, list[int]]) -> str:
    """:func:`swap_problem` against sizes by role."""
    for role in ("params", "master", "optimizer", "grads"):
        w, g = sorted(want.get(role, [])), sorted(got.get(role, []))
        if len(g) != len(w):
            return f"{role}: DeepSpeed wrote {len(w)} file(s), you predicted {len(g)}"
        off = [(b, a) for b, a in zip(g, w) if b != a]
        if off:                                   # the sizes, not shown: direction and how far
            mine, theirs = off[0]
            return (f"{role}: DeepSpeed wrote {len(w)} file(s), as you predicted, but {len(off)} size(s) differ: "
                    f"your {mine:,} B file is too {'large' if mine > theirs else 'small'}, by "
                    f"{'less than 1 KiB' if abs(mine - theirs) < 1024 else '1 KiB or more'}")   # r28: not "more"
    return ""


def _compare(report: Report, given: dict, rows: dict, ranks: list[dict] | None, source: str,
             models: dict | None = None) -> None:
    for label, got in given.items():
        if ranks is None:                           # the recorded run (both ranks wrote the same)
            bad, count = recorded_problem(got, label), sum(c for c, _ in lab_swap_record.DIGESTS[label].values())
        else:
            bad = next((swap_problem(got, r[label]) for r in ranks if swap_problem(got, r[label])), "")
            count = len(ranks[0][label])
        report.rows[rows[label]] = Row("swap_files", label, "wrong" if bad else "ok",
                                       bad or f"{count} files, as DeepSpeed wrote them ({source})")


RUN_PATH = (launch, ds_offload, rank_guard, scratch)      # the modules of the grader's DeepSpeed run


def replaced_run_path() -> list[str]:
    """The functions that :data:`RUN_PATH`'s files define (module level) whose module attribute is
    no longer that function as its file defines it (:func:`is_own`; a ``contextmanager``'s own)."""
    out = []
    for module in RUN_PATH:
        for code in fresh(module.__file__).co_consts:
            if not isinstance(code, types.CodeType) or not code.co_flags & inspect.CO_OPTIMIZED:
                continue
            fn = getattr(module, code.co_name, None)
            inner, cells = getattr(fn, "__wrapped__", None), getattr(fn, "__closure__", None) or ()
            wraps = (getattr(getattr(fn, "__code__", None), "co_filename", "") == contextlib.__file__
                     and any(c.cell_contents is inner for c in cells))
            if not (is_own(fn) or (wraps and is_own(inner))):
                out.append(f"gpumem.{module.__name__.split('.', 1)[1]}.{code.co_name}")
    return out


def implausible(res, labels, models: dict) -> str:
    """'' if ``res`` reads as DeepSpeed's files: one dict per rank (2) with every model, file name
    -> positive size, names DeepSpeed's roles; the master and both moments where a rank's flat fp32
    partition reaches the aio block (never a single file then)."""
    if not isinstance(res, list) or len(res) != 2 or not all(isinstance(r, dict) for r in res):
        return "the run did not return one listing per rank"
    for rank, r in enumerate(res):
        for label in labels:
            files = r.get(label)
            if not isinstance(files, dict) or not all(isinstance(n, str) and type(b) is int and b > 0
                                                      for n, b in files.items()):
                return f"rank {rank} listed no files of {label}"
            kinds = [ds_offload._kind(n.rsplit("/", 1)[-1]) for n in files]
            cfg, block = models[label]
            if 4 * sum(-(-n // 2) for n in numels(cfg)) >= max(1 << 20, block) and (
                    len(files) < 2 or kinds.count("moments") != 2 or "fp32 master" not in kinds):
                return f"rank {rank}'s files of {label} lack the swapped optimizer (master, two moments)"
    return ""


def grade_swaps(report: Report, fn, show: bool, models: dict | None = None) -> None:
    """One row per drawn model (``models``, else :func:`draw_models`): the learner's sizes against
    DeepSpeed's files."""
    models = models or draw_models(seeds.rng())
    given = {}
    for label, (cfg, block) in models.items():
        if fn is None:
            report.rows.append(Row("swap_files", label, "todo", "define swap_files(param_numels, ranks, block_bytes)"))
            continue
        sizes = numels(cfg)

        def ask(sizes=sizes, block=block, label=label):
            got = call(lab_guard.guarded(fn), list(sizes), 2, block)
            bad = swap_shape_problem(got)
            if bad:
                return "wrong", bad
            given[label] = got
            return "todo", "not compared yet"          # replaced below: never ok before the comparison
        run_case(report, "swap_files", label, ask)
    rows = {r.case: i for i, r in enumerate(report.rows) if r.function == "swap_files"}
    if not given:
        return
    swapped = replaced_run_path()
    if swapped:                                    # the grader's own DeepSpeed run, as the course ships it
        for label in given:
            report.rows[rows[label]] = Row(
                "swap_files", label, "error", f"{' and '.join(swapped)} {'were' if len(swapped) > 1 else 'was'} "
                "replaced in this kernel: the swap files are graded against DeepSpeed's own run; restart the kernel")
        return
    ready, why = ds_offload.nvme_ready()
    if not ready:
        unrecorded = [label for label in given if label not in lab_swap_record.DIGESTS]
        for label in unrecorded:                   # drawn for a live run that cannot run here
            report.rows[rows[label]] = Row("swap_files", label, "error", f"no live DeepSpeed run here ({why}) "
                                           "and no recorded one of this model: check() draws recorded ones then")
        _compare(report, {k: v for k, v in given.items() if k not in unrecorded}, rows, None,
                 f"recorded run, DeepSpeed {lab_swap_record.DEEPSPEED}, {lab_swap_record.DATE}; "
                 f"not run live here: {why}", models)
        return

    def measure():
        with ds_offload.swap_folder() as swap:
            try:
                res = launch.run("gpumem.chapters.ch05_offload.lab_runs:swap_run", 2, "cpu", deepspeed=True,
                                 progress=show and not os.environ.get("TQDM_DISABLE"),
                                 models={k: models[k] for k in given}, swap_dir=str(swap))
            except (launch.RankError, RunFailure) as err:
                return "error", failure_line(err)
        odd = implausible(res, given, models)
        if odd:
            return "error", f"the grader's DeepSpeed run is not as the course ships it ({odd}); restart the kernel"
        _compare(report, given, rows, res, "live run on 2 CPU ranks")
    start = len(report.rows)
    failed = run_case(report, "swap_files", "2 CPU ranks, real NVMe offload", measure, case_seconds(cases=2))
    if len(report.rows) > start:              # the run failed: each model it ran says why
        del report.rows[start:]
        for label in given:
            report.rows[rows[label]] = Row("swap_files", label, failed.status, failed.detail)
