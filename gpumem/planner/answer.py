"""What the planner answers: :class:`Plan` (one layout that fits, with its bytes, seconds and
switches) and :class:`Result` (the question, every fitting plan in the ranking's order, and
advice when none fits). ``Answer`` is :class:`Result`'s other name."""

from dataclasses import asdict, dataclass, field

from .memory import Layout


def _fields(lay: Layout) -> dict:
    """The layout's fields, ``ep`` only where expert parallelism is used (a dense plan's JSON
    keeps the keys it had before ``ep`` existed)."""
    out = asdict(lay)
    if lay.ep == 1:
        del out["ep"]
    return out


@dataclass
class Plan:
    """One layout that fits: memory and time per GPU, and the switches that set it up."""
    layout: Layout
    memory: dict
    time: dict
    tokens_per_s: float
    deepspeed: dict
    fsdp: dict | None
    model_code: dict
    megatron: list | None = None   # Megatron-DeepSpeed's command-line arguments (3-D layouts)
    stages: tuple = ()             # layers of each pipeline stage, first to last

    def as_dict(self) -> dict:
        """JSON-ready: the layout's fields, its breakdowns and configs."""
        return {"label": self.layout.label(), "framework": self.layout.framework,
                "tight": bool(self.memory.get("tight")),
                "layout": _fields(self.layout) | {"framework": self.layout.framework,
                                                 "sequence_parallel": self.layout.sequence_parallel,
                                                 "stage_layers": list(self.stages)},
                "memory": self.memory,
                "time": self.time, "tokens_per_s": self.tokens_per_s, "deepspeed": self.deepspeed,
                "fsdp": self.fsdp, "model_code": self.model_code, "megatron": self.megatron}


@dataclass
class Result:
    """What :func:`plan` found: the question, the ranked plans, and advice when none fits."""
    question: dict           # JSON-ready: the keys ``plan --json`` has always printed
    plans: list[Plan]
    considered: int          # every layout enumerated: rejected, pruned and fitting
    closest: dict | None = None
    advice: dict | None = None
    assumptions: list[str] = field(default_factory=list)
    evaluated: int = 0       # layouts whose bytes were computed (the rest pruned or refused first)
    notes: list[str] = field(default_factory=list)   # e.g. pure bf16's rounding risk, when planned
    asked: object = None     # the :class:`~gpumem.planner.question.Question` itself

    @property
    def best(self) -> Plan | None:
        return self.plans[0] if self.plans else None

    def distinct(self, top: int = 10) -> list[Plan]:
        """The best plan of each (recipe, ZeRO, tp, pp, cp, vp, hybrid, ep, offload) combination, ranked, at
        most ``top``."""
        seen, out = set(), []
        for p in self.plans:
            key = (p.layout.recipe, p.layout.zero, p.layout.tp, p.layout.pp, p.layout.offload, p.layout.device,
                   p.layout.cp, p.layout.vp, p.layout.hybrid, p.layout.ep)
            if key not in seen:
                seen.add(key)
                out.append(p)
        return out[:top]

    def as_dict(self, top: int = 10) -> dict:
        """JSON-ready, with the ``top`` distinct plans (all fitting plans are counted)."""
        return {"question": self.question, "considered": self.considered, "evaluated": self.evaluated,
                "fitting": len(self.plans),
                "plans": [p.as_dict() for p in self.distinct(top)], "closest": self.closest,
                "advice": self.advice, "assumptions": self.assumptions, "notes": self.notes}


Answer = Result
