"""The note's section 3 scenarios, computed with chapter 01's estimate (``gpumem.memory.estimate``):
a 7-8B model on one 80 GB GPU with ZeRO-3 and CPU offload, and offload handing the GPU memory it
frees to activations (how many more sequences, and tokens, fit per GPU).

Every case is ZeRO-3 with the mixed recipe, flash attention and sequences of :data:`SEQ` tokens;
the offload device is the CPU. Llama-3-8B stands for the note's "7B" (the course's registry has
no 7B model; 8.03 B parameters is the harder case). The note's third scenario, an RTX 3090 with
INT4 LoRA and offload, needs quantised weights and adapters: chapter 08 (fine-tuning, planned).
"""

from gpumem.memory import estimate, gpus

SEQ = 4096
OFFLOADS = ("none", "optimizer", "optimizer+params")
CASES = (("llama-3-8b", 1), ("llama-3-8b", 8), ("llama-3-70b", 8))


def step(model: str, n_gpus: int, offload: str, checkpoint: str = "full", micro_batch: int = 1,
         seq: int = SEQ) -> estimate.Estimate:
    """One GPU's bytes for the step: ZeRO-3, mixed recipe, flash attention, offload to the CPU."""
    return estimate.estimate(model=model, gpus=n_gpus, zero=3, recipe="mixed", seq=seq, micro_batch=micro_batch,
                             checkpoint=checkpoint, attention="flash", offload=offload, offload_device="cpu")


def sequences_that_fit(model: str, n_gpus: int, offload: str, checkpoint: str, gpu: str = "h100-80gb",
                       seq: int = SEQ, limit: int = 256) -> int:
    """The largest micro-batch (sequences of ``seq`` tokens per GPU) whose step fits ``gpu``'s
    usable memory; 0 when not even one sequence fits. Activations grow with the micro-batch, the
    model states do not, so the first size that does not fit ends the search."""
    usable = gpus.usable(gpu)
    fit = 0
    for b in range(1, limit + 1):
        if step(model, n_gpus, offload, checkpoint, b, seq).total > usable:
            break
        fit = b
    return fit


def rows(cases=CASES, gpu: str = "h100-80gb", seq: int = SEQ) -> list[dict]:
    """One row per (model, GPUs, offload): bytes with one checkpointed sequence, host bytes per GPU,
    and the sequences that fit without checkpointing and with every layer checkpointed."""
    out = []
    for model, n in cases:
        for offload in OFFLOADS:
            e = step(model, n, offload, "full", 1, seq)
            out.append({"model": model, "gpus": n, "offload": offload, "gpu_bytes": e.total,
                        "host_bytes": e.states.host, "usable": gpus.usable(gpu),
                        "fit_none": sequences_that_fit(model, n, offload, "none", gpu, seq),
                        "fit_full": sequences_that_fit(model, n, offload, "full", gpu, seq)})
    return out
