"""Which keys of a DeepSpeed config a real run reads, and whether DeepSpeed accepts the config.

A DeepSpeed config is a JSON dict; keys that the chosen ZeRO stage never looks at are accepted
silently, so a config can look tuned and be half inert. :func:`audit` trains a few steps with
each config on this rank and records every field of ``zero_optimization`` (and of its
``offload_param`` / ``offload_optimizer`` sections) that DeepSpeed's code reads, by wrapping the
pydantic config classes' attribute access (DeepSpeed 0.19.8, ``runtime/zero/config.py`` and
``offload_config.py``). A config DeepSpeed refuses comes back with its error message.

Run it on ranks: ``launch.run("gpumem.runs.ds_audit:audit", 2, deepspeed=True, configs=[...])``.
"""

import contextlib
import io
import logging
from pathlib import Path

_CLASSES = {"": ("deepspeed.runtime.zero.config", "DeepSpeedZeroConfig"),
            "offload_param.": ("deepspeed.runtime.zero.offload_config", "DeepSpeedZeroOffloadParamConfig"),
            "offload_optimizer.": ("deepspeed.runtime.zero.offload_config", "DeepSpeedZeroOffloadOptimizerConfig")}


def json_keys() -> dict[str, str]:
    """Config field -> the JSON key that sets it (``prefetch_bucket_size`` ->
    ``stage3_prefetch_bucket_size``), for every recorded class."""
    import importlib
    out = {}
    for prefix, (module, name) in _CLASSES.items():
        cls = getattr(importlib.import_module(module), name)
        for field, info in cls.model_fields.items():
            out[prefix + field] = prefix + (info.alias or field)
    return out


def quiet_import() -> None:
    """Import DeepSpeed with its import-time chatter (the accelerator line) swallowed, and keep its
    logger to errors, so that a notebook cell that only reads its config classes prints nothing else."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        import deepspeed  # noqa: F401
        from deepspeed.accelerator import get_accelerator
        get_accelerator()
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)


def defaults() -> dict[str, object]:
    """JSON key -> DeepSpeed's default for every field of the recorded classes (``stage3_*``,
    ``offload_param.buffer_size``, ...), read from DeepSpeed's pydantic models."""
    import importlib
    quiet_import()
    out = {}
    for prefix, (module, name) in _CLASSES.items():
        cls = getattr(importlib.import_module(module), name)
        for field, info in cls.model_fields.items():
            out[prefix + (info.alias or field)] = info.default
    return out


@contextlib.contextmanager
def recording_reads():
    """Within the block, every read of a config field is added to the yielded set."""
    import importlib
    seen: set[str] = set()
    patched = []
    for prefix, (module, name) in _CLASSES.items():
        cls = getattr(importlib.import_module(module), name)
        fields, orig = set(cls.model_fields), cls.__getattribute__

        def read(self, attr, prefix=prefix, fields=fields, orig=orig):
            if attr in fields:
                seen.add(prefix + attr)
            return orig(self, attr)
        cls.__getattribute__ = read
        patched.append((cls, orig))
    try:
        yield seen
    finally:
        for cls, orig in patched:
            cls.__getattribute__ = orig


def audit(rank: int, world: int, configs: list[dict], model: str = "tiny", steps: int = 2, seq: int = 16,
          seed: int = 0) -> list[dict]:
    """Per config: did DeepSpeed accept it (else its error), the fields it read (as JSON keys),
    the losses, and the files it wrote under an ``nvme_path``."""
    import deepspeed

    from .training import batches, build
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    keys = json_keys()
    out = []
    for config in configs:
        net = build(model, seed)
        data = batches(net.cfg, steps, world * config["train_micro_batch_size_per_gpu"], seq, seed)
        b = config["train_micro_batch_size_per_gpu"]
        row: dict = {"ok": False, "error": None, "read": [], "losses": []}
        with recording_reads() as seen, contextlib.redirect_stdout(io.StringIO()):
            try:
                engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config)
                for s in range(steps):
                    mine = data[s, rank * b:(rank + 1) * b].to(engine.device)
                    loss = engine(mine[:, :-1], mine[:, 1:])
                    engine.backward(loss)
                    engine.step()
                    row["losses"].append(loss.item())
                row["ok"] = True
            except Exception as err:  # DeepSpeed's refusal is the result
                row["error"] = f"{type(err).__name__}: {str(err).strip().splitlines()[0]}"
        row["read"] = sorted(keys.get(f, f) for f in seen)
        nvme = (config.get("zero_optimization", {}).get("offload_param") or {}).get("nvme_path")
        row["nvme_files"] = sorted(str(p.relative_to(nvme)) for p in Path(nvme).rglob("*") if p.is_file()) \
            if nvme and rank == 0 else []
        out.append(row)
    return out
