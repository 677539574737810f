"""The note's DeepSpeed ZeRO-3 config, examined on real DeepSpeed (2 CPU ranks), and corrected.

The note gives two configs: a ZeRO-3 one (optimizer offload to CPU, parameter offload to NVMe
with no path, two stage-1/2 gather keys, fp16 with dynamic loss scaling, clipping) and an offload
one (an NVMe path and buffer sizes). :func:`examine` runs them and the corrected config with
``gpumem.runs.ds_audit``: what DeepSpeed refuses, and which keys the stage actually reads.
"""

import copy
import math
import tempfile

from gpumem.runs import launch
from gpumem.runs.training import HYPER
from gpumem.memory import models

_COMMON = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "steps_per_print": 10**9,
           "optimizer": {"type": "AdamW", "params": {"lr": HYPER["lr"], "betas": list(HYPER["betas"]),
                                                     "eps": HYPER["eps"], "weight_decay": HYPER["weight_decay"]}}}

# The note's first config, key for key (its Python True written as JSON true).
NOTE = {"zero_optimization": {"stage": 3,
                              "offload_optimizer": {"device": "cpu", "pin_memory": True},
                              "offload_param": {"device": "nvme"},
                              "allgather_partitions": True, "allgather_bucket_size": 5e8,
                              "overlap_comm": True, "contiguous_gradients": True},
        "fp16": {"enabled": True, "loss_scale": 0, "loss_scale_window": 1000},
        "gradient_clipping": 1.0}

# The same intent, as DeepSpeed 0.19.8 reads it for Llama-3-70B on 8 GPUs.
CORRECTED = {"bf16": {"enabled": True},
             "zero_optimization": {"stage": 3,
                                   "offload_optimizer": {"device": "cpu", "pin_memory": True},
                                   "offload_param": {"device": "nvme", "nvme_path": "/local_nvme",
                                                     "pin_memory": True, "buffer_count": 5,
                                                     "buffer_size": 2e8},
                                   "overlap_comm": True, "contiguous_gradients": True,
                                   "reduce_bucket_size": 5e8,
                                   "stage3_prefetch_bucket_size": 5e7,
                                   "stage3_param_persistence_threshold": 1e5,
                                   "stage3_max_live_parameters": 1e9,
                                   "stage3_max_reuse_distance": 1e9},
             "aio": {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1,
                     "single_submit": False, "overlap_events": True},
             "gradient_clipping": 1.0}

# Why each key of the note's config changes (or not) in the corrected one, by dotted key.
WHY = {
    "fp16.enabled": "Llama-3 was trained in bf16: fp32's exponent range, no loss scaling",
    "fp16.loss_scale": "dynamic loss scaling exists for fp16's narrow range; bf16 needs none",
    "fp16.loss_scale_window": "part of fp16's loss scaling",
    "bf16.enabled": "bf16 instead of fp16",
    "zero_optimization.offload_param.nvme_path": "NVMe offload needs a folder on a local NVMe drive",
    "zero_optimization.offload_param.pin_memory": "pinned host buffers for the swaps (DeepSpeed's default)",
    "zero_optimization.offload_param.buffer_count": "swap buffers per rank (DeepSpeed's default)",
    "zero_optimization.offload_param.buffer_size": "elements per swap buffer: must hold the largest shard "
                                                   "({largest:,} elements at 70B on 8 GPUs)",
    "zero_optimization.allgather_partitions": "read by no code path of DeepSpeed 0.19.8",
    "zero_optimization.allgather_bucket_size": "a stage 1/2 key; stage 3 never reads it",
    "zero_optimization.reduce_bucket_size": "stage 3's gradient bucket, in elements (default)",
    "zero_optimization.stage3_prefetch_bucket_size": "stage 3's gather-ahead bucket, in elements (default)",
    "zero_optimization.stage3_param_persistence_threshold": "tensors kept whole, in elements (default)",
    "zero_optimization.stage3_max_live_parameters": "elements whole at once before prefetch stops (default)",
    "zero_optimization.stage3_max_reuse_distance": "reuse window, in elements (default)",
    "aio": "optional: DeepSpeed's defaults apply without it (AIO_DEFAULT_DICT); shown to name the keys",
}

# What the asynchronous-I/O keys mean (DeepSpeed 0.19.8, runtime/swap_tensor/constants.py).
AIO_KEYS = {"block_size": "bytes per I/O request",
            "queue_depth": "I/O requests in flight at once",
            "intra_op_parallelism": "threads that split one swap between them",
            "single_submit": "submit requests one by one (true) or as a batch (false)",
            "overlap_events": "overlap submitting requests with waiting for finished ones"}


def _flat(d: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        out += _flat(v, f"{prefix}{k}.") if isinstance(v, dict) and k in ("offload_param", "offload_optimizer") \
            else [prefix + k]
    return out


def note_keys() -> list[str]:
    """The keys the note sets under ``zero_optimization`` (offload sections flattened)."""
    return _flat(NOTE["zero_optimization"])


def swap_buffer_need(model: str = "llama-3-70b", gpus: int = 8) -> dict:
    """NVMe parameter offload swaps each rank's partition through a pinned buffer of
    ``buffer_size`` elements and asserts the partition fits; the largest partition is the
    embedding's (or head's) 1/N."""
    cfg = models.get(model)
    largest = math.ceil(cfg.vocab * cfg.d_model / gpus)
    return {"model": model, "gpus": gpus, "largest_partition": largest,
            "note_buffer_size": 1e8, "fits_note": largest <= 1e8,
            "corrected_buffer_size": CORRECTED["zero_optimization"]["offload_param"]["buffer_size"]}


def _runnable(config: dict, nvme: str) -> dict:
    """A config for the 2-rank CPU run: the course's batch and optimizer, the NVMe folder a
    temporary one, the swap buffer sized for the tiny model."""
    c = copy.deepcopy(config) | copy.deepcopy(_COMMON)
    param = c["zero_optimization"].get("offload_param") or {}
    if "nvme_path" in param:
        param["nvme_path"] = nvme
        param["buffer_size"] = 10**6
    return c


def examine(ranks: int = 2, progress: bool = True) -> dict:
    """Run the note's config, the note's config in bf16, the corrected config (stage 3) and the
    note's gather keys under stage 2; per run: accepted or DeepSpeed's error, keys read."""
    fixed_bf16 = copy.deepcopy(NOTE)
    fixed_bf16.pop("fp16")
    fixed_bf16["bf16"] = {"enabled": True}
    stage2 = {"bf16": {"enabled": True},
              "zero_optimization": {k: v for k, v in NOTE["zero_optimization"].items()
                                    if not k.startswith("offload")} | {"stage": 2}}
    runs = {"note as written": NOTE, "note, bf16 instead of fp16": fixed_bf16,
            "corrected (stage 3)": CORRECTED, "note's gather keys under stage 2": stage2}
    with tempfile.TemporaryDirectory(prefix="gpumem-nvme-") as nvme:
        res = launch.run("gpumem.runs.ds_audit:audit", ranks, deepspeed=True, progress=progress, timeout=1200,
                         configs=[_runnable(c, nvme) for c in runs.values()])
    out = {"ranks": ranks, "note_keys": note_keys(), "runs": {}}
    for (name, config), row in zip(runs.items(), res[0]):
        set_keys = _flat(config["zero_optimization"])
        out["runs"][name] = {"accepted": row["ok"], "error": row["error"], "losses": row["losses"],
                             "set": set_keys, "read": [k for k in set_keys if k in row["read"]],
                             "ignored": [k for k in set_keys if k not in row["read"]],
                             "read_all": row["read"], "nvme_files": len(row["nvme_files"])}
    return out


def _dotted(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and k != "aio":
            out |= _dotted(v, f"{prefix}{k}.")
        else:
            out[prefix + k] = v
    return out


def _show(v) -> str:
    import json
    if v is None:
        return "-"
    if isinstance(v, float) and v >= 1e4:
        return f"{v:.0e}".replace("e+0", "e")
    return json.dumps(v)


def config_diff() -> str:
    """The note's config and the corrected one side by side, key by key, and why each differs;
    a value equal to DeepSpeed's default (read from DeepSpeed) is marked so."""
    from gpumem.runs import ds_audit
    note, fixed, ds = _dotted(NOTE), _dotted(CORRECTED), ds_audit.defaults()
    largest = swap_buffer_need()["largest_partition"]
    import textwrap
    lines = ["keys under zero_optimization are written without that prefix",
             f"{'key':34s} {'note':>8s} {'corrected':>13s}   why"]
    for key in list(note) + [k for k in fixed if k not in note]:
        a, b = note.get(key), fixed.get(key)
        short = key.removeprefix("zero_optimization.")
        default = short in ds and not isinstance(b, (dict, str, type(None))) and b == ds[short]
        why = textwrap.wrap(WHY.get(key, "as the note has it" if a == b else "").format(largest=largest), 40) or [""]
        shown = ("-", "{...}") if key == "aio" else (_show(a), _show(b))
        lines.append(f"{short:34s} {shown[0]:>8s} {shown[1]:>13s}{'*' if default else ' '}  {why[0]}")
        lines += [f"{'':60s}{more}" for more in why[1:]]
    lines.append("* = DeepSpeed's default for that key (read from DeepSpeed's config classes); - = not set")
    return "\n".join(lines)


def aio_table() -> str:
    """The corrected config's ``aio`` keys: value, DeepSpeed's default, what each sets."""
    from gpumem.runs import ds_audit
    ds_audit.quiet_import()
    from deepspeed.runtime.swap_tensor.aio_config import AIO_DEFAULT_DICT
    lines = [f"{'aio key':22s} {'value':>8s} {'default':>8s}  meaning"]
    for key, value in CORRECTED["aio"].items():
        lines.append(f"{key:22s} {_show(value):>8s} {_show(AIO_DEFAULT_DICT[key]):>8s}  {AIO_KEYS[key]}")
    return "\n".join(lines)


def runs_table(result: dict) -> str:
    """One line per run: accepted (with the loss to two decimals) or DeepSpeed's refusal. Which
    refusal the note's own config meets first depends on the CPU: DeepSpeed's CPU accelerator
    accepts fp16 where oneDNN supports it (AVX512-FP16 or AMX-FP16), and then the NVMe path stops
    it; a bf16 loss differs between CPUs in its third decimal."""
    lines = []
    for name, r in result["runs"].items():
        state = "accepted; trained, loss " + " -> ".join(f"{x:.2f}" for x in r["losses"]) if r["accepted"] \
            else "refused: " + r["error"].replace("OffloadDeviceEnum.", "")
        lines += [name, f"  {state}"]
    return "\n".join(lines)


def reads_table(result: dict) -> str:
    """Per key the note sets: does stage 3 (the corrected config) read it, and stage 2."""
    s3, s2 = result["runs"]["corrected (stage 3)"], result["runs"]["note's gather keys under stage 2"]
    lines = [f"{'key the note sets':38s} {'stage 3 reads it':>16s} {'stage 2 reads it':>16s}"]
    for key in result["note_keys"]:
        yes3 = "yes" if key in s3["read_all"] else "no"
        yes2 = "yes" if key in s2["read_all"] else ("no" if key in s2["set"] else "(not set)")
        lines.append(f"{key:38s} {yes3:>16s} {yes2:>16s}")
    return "\n".join(lines)


def config_table(result: dict) -> str:
    """One line per run, then per note key whether stage 3 and stage 2 read it."""
    return runs_table(result) + "\n\n" + reads_table(result)
