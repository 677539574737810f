"""Lab 04's record of how ``ring_attention`` reached its answer, beside the op watch.

Right numbers are not enough: ring attention is one ``tiled_forward`` per shard its queries see,
merged by ``merge_partials``. :func:`ring_calls` records, through a profile hook on the code
objects (however the functions are reached), every call of the given ``tiled_forward`` (the key
tensor it got, what it returned) and of the learner's ``merge_partials`` (the parts, the answer).
:func:`ring_wrong` then names the first thing skipped: a visible shard that no ``tiled_forward``
call computed, a shard computed twice or one no query sees, a partial that never reached the
merge, an answer that is not the merge's. :func:`empty_shard_hint` says which shard is empty
when the answer has NaN (``tiled_forward`` of no keys gives out = 0/0); :func:`masked_shard_hint`
which shard was masked where no key is hidden (an earlier shard of a causal ring, any shard of a
ring that is not causal) when its numbers are wrong.
"""

import contextlib

import torch
from torch.utils._python_dispatch import _disable_current_modes

from gpumem.memory import flash_tiled

from .labblock import chained


def _copy(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, (tuple, list)):
        return type(x)(_copy(t) for t in x) if isinstance(x, tuple) else [_copy(t) for t in x]
    return x


@contextlib.contextmanager
def ring_calls(merge):
    """Record ``("forward", k, returned, causal)`` and ``("merge", parts, returned, None)`` calls
    while the block runs; ``merge`` is the learner's ``merge_partials`` (or None)."""
    calls, stack = [], []
    forward = flash_tiled.tiled_forward.__code__
    merging = getattr(merge, "__code__", None)

    def record(frame, event, arg):
        code = frame.f_code
        if code is forward or (merging is not None and code is merging):
            if event == "call":
                first = frame.f_locals.get(code.co_varnames[1 if code is forward else 0])
                stack.append((first, frame.f_locals.get("causal")) if code is forward else (_snapshot(first), None))
            elif event == "return" and stack:
                first, masked = stack.pop()
                with _disable_current_modes():
                    calls.append(("forward" if code is forward else "merge", first, _copy(arg), masked))
    with chained(record):
        yield calls


def _snapshot(parts):
    with _disable_current_modes():
        return _copy(list(parts)) if isinstance(parts, (tuple, list)) else parts


def _same(a, b) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
        return False
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


def ring_wrong(calls, ks, rank: int, causal: bool, got) -> str:
    """'' or the first thing the recorded calls skipped."""
    spans = [(sum(k.shape[2] for k in ks[:r]), sum(k.shape[2] for k in ks[:r + 1])) for r in range(len(ks))]
    partial = {}
    for kind, first, result, _ in calls:
        if kind != "forward":
            continue
        r = next((r for r, k in enumerate(ks) if k.shape[2] and _same(first, k)), None)
        if r is None:
            continue                                  # an empty shard, or keys the grader never gave
        if causal and r > rank:
            return (f"it ran tiled_forward on shard {r} (keys {spans[r][0]}:{spans[r][1]}), which comes after "
                    f"rank {rank}'s queries: with causal no query sees it, skip it")
        if r in partial:
            return f"it ran tiled_forward on shard {r} twice; one partial per shard is enough"
        partial[r] = result
    for r, k in enumerate(ks):
        if k.shape[2] and not (causal and r > rank) and r not in partial:
            return (f"shard {r} (keys {spans[r][0]}:{spans[r][1]}) was not computed with the given tiled_forward: "
                    f"ring attention takes one partial per shard its queries see, then merges them")
    merges = [(parts, result) for kind, parts, result, _ in calls if kind == "merge"]
    if not merges:
        return "it never called merge_partials: join the shards' partials with your merge"
    given = [p for parts, _ in merges if isinstance(parts, list) for p in parts if isinstance(p, (tuple, list))]
    for r, (out, lse) in sorted(partial.items()):
        if not any(len(p) == 2 and _same(p[0], out) and _same(p[1], lse) for p in given):
            return f"shard {r}'s partial from tiled_forward never reached merge_partials: merge the partials"
    last = merges[-1][1]
    if not (isinstance(last, tuple) and len(last) == 2 and all(_same(x, y) for x, y in zip(got, last))):
        return "its answer is not what its last merge_partials call returned: return the merge"
    return ""


def masked_shard_hint(calls, ks, rank: int, causal: bool) -> str:
    """'' or the first shard ``tiled_forward`` ran on that no query of the rank sees (causal: a shard
    after the rank's own, review r37 #3), or was told to mask where no key is hidden: in a causal
    ring a shard before the rank's own (every key of it lies before every query of the rank); in a
    ring that is not causal any shard, the rank's own included (review r22: that slip had no hint).
    The causal case names the slip and asks, without the fix: cell 10 asks which shards need the
    mask (review r28)."""
    for kind, first, _, masked in calls:
        r = next((r for r, k in enumerate(ks) if k.shape[2] and _same(first, k)), None) if kind == "forward" else None
        keys = f"keys {sum(k.shape[2] for k in ks[:r])}:{sum(k.shape[2] for k in ks[:r + 1])}" if r is not None else ""
        if causal and r is not None and r > rank:       # review r37 #3: a shard no query of the rank sees
            q0 = sum(k.shape[2] for k in ks[:rank])
            return (f"tiled_forward ran on shard {r} ({keys}), which lies wholly after rank {rank}'s queries "
                    f"(positions {q0}:{q0 + ks[rank].shape[2]}): which of its keys does a query of rank {rank} "
                    f"see? ")
        if not masked or r is None or (causal and r >= rank):
            continue
        if causal:
            return (f"shard {r} ({keys}) lies wholly before rank {rank}'s queries, yet was run with "
                    f"causal=True: what does tiled_forward's top-left mask hide in it? ")
        own = f", rank {rank}'s own" if r == rank else ""
        return (f"shard {r} ({keys}{own}) was run with causal=True, but this ring is not causal: every query "
                f"sees every key, so no shard takes the mask, not even the rank's own. ")
    return ""


def empty_shard_hint(ks, got) -> str:
    """'' or, when the answer has NaN and a shard is empty, which one and why."""
    empty = [r for r, k in enumerate(ks) if k.shape[2] == 0]
    out = got[0] if isinstance(got, (tuple, list)) and got else None
    if not empty or not (isinstance(out, torch.Tensor) and bool(out.detach().isnan().any())):
        return ""
    which = ("shard " if len(empty) == 1 else "shards ") + ", ".join(map(str, empty))
    return (f"{which} {'is' if len(empty) == 1 else 'are'} empty (0 keys): tiled_forward gives out NaN "
            f"(0/0) and lse -inf there, not the out 0 of the merge's convention; skip it or zero its out. ")
