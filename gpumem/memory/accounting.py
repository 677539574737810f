"""Model-state accounting: bytes per parameter by recipe, sharded by ZeRO, optionally offloaded.

Recipes (per parameter):

=========  ======  =====  =============================  =====
recipe     params  grads  optimizer                      total
=========  ======  =====  =============================  =====
pure-bf16  2       2      m 2 + v 2                      8
mixed      2       2      fp32 master 4 + m 4 + v 4      16
mixed-ds   2       4      fp32 master 4 + m 4 + v 4      18   (DeepSpeed's estimator)
fp32       4       4      m 4 + v 4                      16
=========  ======  =====  =============================  =====

Mixed precision does not shrink model states: fp32 (4+4+8) and bf16-mixed (2+2+12) are both 16.
ZeRO (arXiv:1910.02054) shards optimizer states (stage 1), then gradients (2), then parameters
(3) over N data-parallel ranks; each rank holds ceil(Psi / N) elements of a sharded state.
"""

from dataclasses import dataclass, field

from ..errors import UsageError, one_of, positive_int

RECIPES = ("pure-bf16", "mixed", "mixed-ds", "fp32")
OFFLOADS = ("none", "optimizer", "optimizer+params")
DEVICES = ("cpu", "nvme")


@dataclass(frozen=True)
class Recipe:
    """The bytes per parameter one precision recipe spends on parameters, gradients and optimizer states."""
    name: str
    params: int
    grads: int
    optimizer: tuple[tuple[str, int], ...]
    about: str
    step_counter: bool   # torch.optim.AdamW keeps a 4-byte fp32 step tensor per parameter tensor

    @property
    def optimizer_bytes(self) -> int:
        return sum(b for _, b in self.optimizer)

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer_bytes


RECIPE = {r.name: r for r in [
    Recipe("pure-bf16", 2, 2, (("m bf16", 2), ("v bf16", 2)),
           "everything in bf16, no master copy (the note's 4 B optimizer figure)", True),
    Recipe("mixed", 2, 2, (("master fp32", 4), ("m fp32", 4), ("v fp32", 4)),
           "bf16 weights and grads, fp32 master and moments (ZeRO paper, K = 12)", False),
    Recipe("mixed-ds", 2, 4, (("master fp32", 4), ("m fp32", 4), ("v fp32", 4)),
           "as mixed, with fp32 gradients: DeepSpeed's estimator counts 18 B", False),
    Recipe("fp32", 4, 4, (("m fp32", 4), ("v fp32", 4)),
           "no mixed precision at all", True),
]}


def recipe(name: str) -> Recipe:
    """Look up a recipe by name; a UsageError lists the accepted names."""
    return RECIPE[one_of(name, RECIPES, "recipe")]


def recipe_table() -> str:
    """The per-recipe bytes-per-parameter table, rendered."""
    lines = [f"{'recipe':10s} {'params':>6s} {'grads':>6s} {'optimizer':>10s} {'total':>6s}  optimizer holds"]
    for r in RECIPE.values():
        parts = " + ".join(f"{label} {b}" for label, b in r.optimizer)
        lines.append(f"{r.name:10s} {r.params:>5d}B {r.grads:>5d}B {r.optimizer_bytes:>9d}B {r.total:>5d}B  {parts}")
    return "\n".join(lines)


@dataclass
class States:
    """Model-state bytes held by one GPU, plus what was offloaded (per GPU)."""
    params: int
    grads: int
    optimizer: int
    host: int = 0
    nvme: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


def shard(n: int, ranks: int) -> int:
    """Elements one rank holds when ``n`` elements are split evenly (last shard padded)."""
    return -(-n // ranks)


def model_states(n_params: int, recipe_name: str = "mixed", gpus: int = 1, zero: int = 0,
                 offload: str = "none", device: str = "cpu", n_tensors: int = 0) -> States:
    """Per-GPU bytes of parameters, gradients and optimizer states.

    ``n_tensors`` (parameter tensors in the model) adds torch AdamW's 4-byte step counters where
    the recipe uses ``torch.optim.AdamW``; leave it 0 for paper-style accounting.
    """
    n_params = positive_int(n_params, "parameter count")
    gpus = positive_int(gpus, "GPU count")
    if zero not in (0, 1, 2, 3):
        raise UsageError(f"ZeRO stage must be 0, 1, 2 or 3, got {zero!r}")
    one_of(offload, OFFLOADS, "offload")
    one_of(device, DEVICES, "offload device")
    r = recipe(recipe_name)
    if offload == "optimizer+params" and zero != 3:
        raise UsageError("offloading parameters needs ZeRO stage 3 (--zero 3); accepted with "
                         "--zero 0-2: --offload none or optimizer")
    if device == "nvme" and offload != "none" and zero != 3:
        raise UsageError("NVMe offload needs ZeRO stage 3 (--zero 3); with --zero 0-2 use --offload-device cpu")
    p_elems = shard(n_params, gpus) if zero >= 3 else n_params
    g_elems = shard(n_params, gpus) if zero >= 2 else n_params
    o_elems = shard(n_params, gpus) if zero >= 1 else n_params
    counters = 4 * n_tensors if r.step_counter else 0
    s = States(params=r.params * p_elems, grads=r.grads * g_elems,
               optimizer=r.optimizer_bytes * o_elems + counters)
    if offload != "none":
        moved = s.optimizer
        s.optimizer = 0
        if r.grads > r.params:  # fp32 gradients belong to the optimizer side and move with it
            moved += (r.grads - r.params) * g_elems
            s.grads = r.params * g_elems
            s.notes.append("fp32 gradients live with the optimizer on the offload device")
        if offload == "optimizer+params":
            moved += s.params
            s.params = 0
            s.notes.append("parameters are fetched to the GPU layer by layer (plus buffers)")
        if device == "cpu":
            s.host = moved
        else:
            s.nvme = moved
    return s
