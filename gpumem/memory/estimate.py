"""One training step's memory per GPU: model states (``accounting``) + activations (``activations``).

This is what ``python -m gpumem estimate`` prints. Activations are per GPU and do not shrink
with ZeRO (each rank runs its own micro-batch); temporaries (gradients of activations in
backward, optimizer workspace) are not included: ``python -m gpumem trace`` measures them.
"""

from dataclasses import dataclass, field

from ..errors import UsageError
from . import accounting, models
from .activations import Activations, activations


def n_param_tensors(cfg: models.ModelConfig) -> int:
    """Parameter tensors: embedding, head, final norm, and 9 per layer (7 linear + 2 norms)."""
    return 9 * cfg.n_layers + 3


@dataclass
class Estimate:
    """One training step's per-GPU bytes: model states, activations, and the options behind them."""
    model: str
    n_params: int
    recipe: str
    gpus: int
    zero: int
    states: accounting.States
    acts: Activations | None = None
    options: dict = field(default_factory=dict)

    @property
    def activation_bytes(self) -> int:
        return self.acts.peak if self.acts else 0

    @property
    def total(self) -> int:
        return self.states.total + self.activation_bytes

    def as_dict(self) -> dict:
        s = self.states
        out = {"model": self.model, "n_params": self.n_params, "recipe": self.recipe,
               "gpus": self.gpus, "zero": self.zero, **self.options,
               "per_gpu": {"params": s.params, "grads": s.grads, "optimizer": s.optimizer,
                           "activations": self.activation_bytes, "total": self.total},
               "activations_counted": self.acts is not None}
        if s.host:
            out["host"] = s.host
        if s.nvme:
            out["nvme"] = s.nvme
        if s.notes:
            out["notes"] = s.notes
        return out


def estimate(model: str | None = None, params: int | None = None, gpus: int = 1, zero: int = 0,
             recipe: str = "mixed", seq: int = 4096, micro_batch: int = 1, checkpoint: str = "none",
             attention: str = "flash", offload: str = "none", offload_device: str = "cpu") -> Estimate:
    """Per-GPU bytes of a training step for a registry model, or model states only for a parameter count."""
    if (model is None) == (params is None):
        raise UsageError("give exactly one of --model NAME or --params N")
    if model is not None:
        cfg = models.get(model)
        states = accounting.model_states(cfg.n_params(), recipe, gpus, zero, offload, offload_device,
                                         n_tensors=n_param_tensors(cfg))
        acts = activations(cfg, seq, micro_batch, attention, checkpoint, recipe)
        opts = {"seq": seq, "micro_batch": micro_batch, "checkpoint": checkpoint, "attention": attention}
        return Estimate(cfg.name, cfg.n_params(), recipe, gpus, zero, states, acts,
                        opts | {"offload": offload, "offload_device": offload_device})
    states = accounting.model_states(params, recipe, gpus, zero, offload, offload_device)
    return Estimate("params", int(params), recipe, gpus, zero, states, None,
                    {"offload": offload, "offload_device": offload_device})
