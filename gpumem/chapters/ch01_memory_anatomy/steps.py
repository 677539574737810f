"""Chapter 01's traced steps, computed once and shared by the diagrams, the ledger and the quiz.

A composed trace of Llama-3-70B takes about a second and a full timeline several; the scenario
box, the claims ledger and the quiz all need the same few, so they are cached here
(``functools.lru_cache``). Everything is the engine's: ``tracing.trace_fast``,
``timeline.recorded`` and ``timeline.zero3_peak`` (one GPU's ZeRO-3 verdict, with the working set
of ``accounting.zero3_gathered``, read at call time).

``split_states`` is the best case of any sharding: model states divided evenly over N GPUs,
each GPU running its own micro-batch, nothing else. Without a timeline it brackets one GPU's
peak: at least the parameters and optimizer states (held the whole step) plus the activation
peak; at most every part at its largest at once, the traced temporaries included (the sum of
states and activations alone is not a bound: at large N the logits' gradient outweighs the
gradient shards it would double-count).
"""

from functools import lru_cache

from gpumem.memory import timeline as timelines, tracing
from gpumem.memory.estimate import estimate


@lru_cache(maxsize=None)
def trace(model: str, recipe: str = "mixed", policy: str = "none", seq: int = 4096,
          micro_batch: int = 1, kernel: str = "flash", adamw: str = "for-loop") -> tracing.Trace:
    """The composed fake-tensor trace of one unsharded step (``tracing.trace_fast``), cached."""
    return tracing.trace_fast(model, recipe, kernel, policy, seq, micro_batch, adamw=adamw)


def timeline(model: str, recipe: str = "mixed", policy: str = "none", seq: int = 4096) -> timelines.Timeline:
    """One unsharded step's timeline (every operator, ``timeline.recorded``: cached in the engine,
    so chapter 02's verdict reads the same one)."""
    return timelines.recorded(model, recipe, "flash", policy, seq)


@lru_cache(maxsize=None)
def zero3_peak(model: str, recipe: str = "mixed", policy: str = "none", gpus: int = 8,
               seq: int = 4096) -> dict:
    """One GPU's peak under ZeRO-3 (the engine's ``timeline.zero3_peak`` on the cached timeline):
    ``total`` bytes, ``phase``, ``module``, ``operator`` and the bytes per category ``at`` then."""
    return timelines.zero3_peak(model, recipe, policy, gpus, seq, tl=timeline(model, recipe, policy, seq))


def split_states(model: str, recipe: str = "mixed", gpus: int = 8, seq: int = 4096,
                 micro_batch: int = 1, checkpoint: str = "none", attention: str = "flash") -> dict:
    """One GPU's bytes with the model states split evenly over ``gpus`` and its own micro-batch's
    activations, bracketed without a timeline: ``at_least`` (parameters + optimizer states + the
    activation peak: a moment every step passes through, before any gradient exists) and
    ``at_most`` (every part at its largest at once: states / N, the activation peak and the
    traced temporaries' peak, which sharding does not shrink in backward). ``sum`` is the four
    parts the note adds (no temporaries); ``activations`` alone decide when no split can help."""
    d = estimate(model=model, recipe=recipe, seq=seq, micro_batch=micro_batch, checkpoint=checkpoint,
                 attention=attention, gpus=gpus, zero=3).as_dict()["per_gpu"]
    acts, states = d["activations"], d["params"] + d["grads"] + d["optimizer"]
    temps = trace(model, recipe, checkpoint, seq, micro_batch, attention).peaks["temporaries"]
    return {"at_least": d["params"] + d["optimizer"] + acts, "sum": states + acts,
            "at_most": states + acts + temps, "activations": acts, "states": states}
