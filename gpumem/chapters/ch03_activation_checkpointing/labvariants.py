"""Lab 03's small unseen functions for the general checkpoint: random numbers, two outputs,
an output that does not require grad, non-tensor arguments, and a ``run`` whose values change between forward and backward. Each is
compared with plain autograd, and ``run`` must be called again while backward runs (a checkpoint
that keeps what ``run`` saved never needs to).

The last case tells a real recomputation from one for show: its ``run`` scales by a tensor
that holds 0.7 in the forward and 1.3 once the forward is done (changed in place, as nothing of
``run`` but its inputs may be kept). Gradients taken from the re-run equal plain autograd's at
1.3 (the loss is linear in the outputs, so the forward's values do not enter), whether the
checkpoint is an ``autograd.Function`` or saved-tensor hooks that refill the forward's graph;
gradients taken from copies kept in the forward are those at 0.7, whatever re-ran beside them.

The dropout case moves the random-number generator on between forward and backward. When its
gradients differ, the case is run again with the generator put back to the forward's state
before backward instead: if its gradients agree then, the re-run drew other masks than the
forward, and the row says so (review r9: "gradients differ" alone did not say what was skipped;
review r29 #2: that run compares gradients only, so a re-run with no RNG handling at all, which
moves the generator on, gets the hint too). After backward
the generator must be where plain autograd leaves it (review r20: a re-run that replayed the forward's
state and never put the later one back passed, and repeats random numbers from then on).

The mask case (review r22 #5) returns a second output made by a comparison, which does not
require grad in plain autograd nor in the re-run. An ``autograd.Function`` marks it as requiring
grad and hands backward a gradient for it; a backward that pushes every output's gradient
through the re-run fails there ("does not require grad"), and the row says which output, not the
fix (review r29 #3).

Before these cases, the drawn Llama's step (``labcheck``) takes its gradients through
:func:`measured_with_grads`: a parameter the checkpoint's backward never reached gets a row that
names it and asks which call reaches the weights ``run`` uses (review r35 #1: a backward through
``autograd.grad`` on the inputs alone left the weights' ``.grad`` None, and the row showed the
tracer's AttributeError)."""

from gpumem.course.grading import LearnerError, Report, call, returned, run_case

from .labguard import guarded

DROPOUT = "random numbers (dropout) replayed"
# review r30: these two name the symptom, not the fix
RNG_LEFT = ("after backward the random-number generator is not where plain autograd leaves it: the re-run "
            "left the forward's state in place, so later draws repeat earlier ones")
NO_GRAD = "an output that does not require grad (a mask)"
NO_GRAD_HINT = ("your backward sent a gradient into run's second output (a mask), which does not require grad in "
                "plain autograd nor in the re-run: which of the re-run's outputs can backward go through?")
NO_WEIGHT_GRAD = ("parameter {name} got no gradient: run uses it, but your checkpoint's backward never reached it. "
                  "Gradients must reach the weights run uses, not only args: which call sends gradients into them?")
MASKS = ("the re-run drew other dropout masks than the forward: what decides a mask, and where is that "
         "state when backward runs?")


def measured_with_grads(cfg, ckpt, seq: int, batch: int):
    """(the step of ``cfg`` with every layer checkpointed by ``ckpt``, measured with its gradients,
    '') or (None, the row's detail) where a parameter got no gradient (module docstring). The
    learner's own errors pass through ``call``."""
    from gpumem.memory import recompute_trace as rt

    def step():
        try:
            return rt.measure(cfg, "full", ckpt, seq=seq, micro_batch=batch, keep_grads=True), ""
        except rt.NoGradient as err:
            return None, NO_WEIGHT_GRAD.format(name=err.name)
    return call(step)


def variants():
    """Unseen cases for the general checkpoint: (w, x, [(name, run, args)]), w a weight."""
    import torch
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(3)
    w = torch.randn(12, 12, generator=g, dtype=torch.float64, requires_grad=True)
    x = torch.randn(5, 12, generator=g, dtype=torch.float64, requires_grad=True)

    def dropout(x):
        return F.dropout(torch.tanh(x @ w), 0.4, training=True) @ w

    def two_outputs(x):
        y = torch.sin(x @ w)
        return y * x, y.sum(dim=1)

    def with_mask(x):
        y = torch.tanh(x @ w) @ w
        return y, (y > 0).to(y.dtype)                        # a comparison: no gradient flows

    def with_options(x, scale, how):
        y = (x @ w) * scale
        return torch.tanh(y) if how == "tanh" else torch.relu(y)
    u = torch.full((12,), 0.7, dtype=torch.float64)          # read afresh by each run

    def changes(x):
        return torch.sin(torch.tanh(x @ w) * u) @ w

    def switch(to):
        u.fill_(to)
    return w, x, ((DROPOUT, dropout, (x,), None),
                  ("two outputs", two_outputs, (x,), None),
                  (NO_GRAD, with_mask, (x,), None),
                  ("non-tensor arguments (a float, a string)", with_options, (x, 0.7, "tanh"), None),
                  ("gradients taken from the re-run", changes, (x,), switch))


def _loss(out):
    import torch
    outs = out if isinstance(out, tuple) else (out,)
    return sum((o * torch.arange(1, o.numel() + 1, dtype=o.dtype).reshape(o.shape)).sum() for o in outs)


def grade_variants(report: Report, ckpt) -> bool:
    """One row per unseen function, up to the first that fails; True when all pass."""
    import torch
    w, x, cases = variants()
    for name, run, args, switch in cases:
        def body(run=run, args=args, switch=switch, name=name, replay=False):
            grads, again, states, needs = [], [0], [], []
            for wrapped in (False, True):
                if switch:                            # plain autograd at 1.3 throughout; yours at 0.7 until
                    switch(0.7 if wrapped else 1.3)   # the forward is done, 1.3 from then on
                w.grad = x.grad = None
                torch.manual_seed(11)
                armed = [False]

                def counted(*a, run=run, armed=armed):
                    again[0] += armed[0]
                    return run(*a)
                out = call(ckpt, counted, *args) if wrapped else run(*args)
                armed[0] = True                       # from here on, a call of run is a re-run
                if switch and wrapped:
                    switch(1.3)
                outs = out if isinstance(out, tuple) else (out,)
                if not all(torch.is_tensor(o) for o in outs):
                    return "wrong", "checkpoint(run, ...) " + returned(out, "what run returns (a tensor or a tuple of them)")
                if wrapped and any(n and not o.requires_grad for n, o in zip(needs, outs)):
                    return "wrong", "an output does not require grad: it is cut from the graph"
                needs = [o.requires_grad for o in outs]       # plain autograd's, for the wrapped run
                if replay:                            # the generator back where the forward began
                    torch.manual_seed(11)
                else:                                 # the RNG moves on between forward and backward
                    torch.rand(7)
                try:
                    call(lambda: _loss(out).backward())
                except LearnerError as err:
                    if name != NO_GRAD:
                        raise
                    return "wrong", f"{NO_GRAD_HINT} (backward raised {err})"
                if w.grad is None or x.grad is None:
                    return "wrong", f"no gradient reached {'the weight' if w.grad is None else 'the input'}: it is cut from the graph"
                grads.append((w.grad.clone(), x.grad.clone()))
                states.append(torch.get_rng_state())   # where backward left the generator
            if not again[0]:
                return "wrong", ("run was not called again in backward: nothing was recomputed, so what run "
                                 "saved was kept instead (keep only the inputs, re-run run in backward)")
            diff = max(float((a - b).abs().max()) for a, b in zip(*grads))
            if replay:                                # gradients only (r29 #2: a re-run without fork_rng
                return ("wrong" if diff else "ok"), ""   # leaves the generator moved on, as RNG_LEFT says)
            if diff and switch:
                return "wrong", ("run gave other values in backward, but your gradients are not the re-run's "
                                 f"(off by up to {diff:.3g}): they come from copies kept in the forward, so the "
                                 "recomputation was for show; take the gradients from the re-run's graph")
            if diff and name == DROPOUT and not replay and body(replay=True) == ("ok", ""):
                return "wrong", f"gradients differ from plain autograd by up to {diff:.3g}: {MASKS}"
            if diff:
                return "wrong", f"gradients differ from plain autograd by up to {diff:.3g}"
            if not torch.equal(*states):
                return "wrong", RNG_LEFT
            return "ok", ""
        if run_case(report, "checkpoint", f"unseen case: {name}", guarded(body)).status != "ok":
            return False
    return True
