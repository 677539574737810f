"""Chapter 08's pictures in text: who holds what in LoRA and QLoRA, the tiny model's bytes by role
measured against the formula, the recipes x cards table, and the frameworks side by side."""

from gpumem import units
from gpumem.memory import finetune as F

from . import scale

GB = 10**9


def idea(cfg, rank: int = 16) -> str:
    """One adapted projection of ``cfg`` (its q matrix), and what each role costs per weight."""
    h, q = cfg.d_model, cfg.q_dim
    a, b = rank * h, q * rank
    low = f"             └──► [ A  {rank} x {h:,} ] ──► [ B  {q:,} x {rank} ] ── x alpha/r "
    head = "        x ───┬──► [ W  frozen: bf16 (LoRA) or NF4 (QLoRA) ] ──"
    plus = max(len(head) + 4, len(low) + 1)
    top = head + "─" * (plus - len(head) - 3) + "► (+) ──► y"
    lines = [
        f"one projection of {cfg.name}: W is {q:,} x {h:,} = {q * h:,} weights (frozen)",
        "",
        top,
        "             │" + " " * (plus - 14) + "▲",
        low + "─" * max(1, plus - len(low)) + "┘",
        f"              trainable: r (in + out) = {a + b:,} = {100 * (a + b) / (q * h):.2f} % of W",
        "",
        "bytes per element, by role         full (mixed)     LoRA           QLoRA",
        "  base weight                      2 (trained)      2 (frozen)     "
        f"{F.nf4_bytes_per_param():.4f} (NF4 + constants)",
        "  its gradient                     2                none           none",
        "  fp32 master + AdamW m, v         4 + 8            none           none",
        "  adapter weight / grad / m, v     -                4 / 4 / 8      4 / 4 / 8",
        "  saved for backward               its input        W only: the    W packed; backward",
        "                                                    adapter saves  dequantises again",
        "                                                    its own input",
    ]
    return "\n".join(lines)


def timeline() -> str:
    """When things happen to one decoder block during a QLoRA step with every layer checkpointed
    and the base on the CPU (FSDP's offload): what crosses PCIe, what the GPU does, what is saved."""
    cols = [("", 10), ("forward", 25), ("backward: re-run forward", 26), ("backward proper", 0)]
    rows = [
        ("PCIe H->D", "copy 1: the 4-bit block", "copy 2: the 4-bit block", "(uses copy 2)"),
        ("", "(prefetched)", "(prefetched again)", ""),
        ("GPU", "each matmul: NF4 ->", "each matmul: NF4 -> bf16", "each matmul: NF4 -> bf16"),
        ("", "bf16, x W^T, free it;", "again, x W^T, free it;", "a 3rd time, dx = g W, free;"),
        ("", "A, B cast to bf16", "A, B cast to bf16 again", "A, B gradients"),
        ("saved", "the block's input only", "the block's activations", "freed as backward goes"),
        ("PCIe D->H", "", "", "A, B gradients (CPU step)"),
    ]

    def line(cells):
        return "".join(f"{c:<{w}}" if w else c for c, (_, w) in zip(cells, cols)).rstrip()
    head = ["one decoder block over one QLoRA step: every layer checkpointed, base on the CPU (FSDP)",
            "", line([c for c, _ in cols]), line(["", "-" * 23, "-" * 24, "-" * 26])]
    tail = ["", "base on the GPU: no copies; LoRA (bf16 base): no NF4 -> bf16, and a copy is 2 B a weight;",
            "no checkpointing: no re-run, so two dequantisations a step, and the forward saves it all."]
    return "\n".join(head + [line(r) for r in rows] + tail)


# the measured runs' names as the chapter shows them: its 8-bit full run keeps no fp32 master,
# unlike lab 08's full-8bit rung (8-bit moments beside a master), so it is named apart
SHOWN = {"full-8bit": "full-8bit-nomaster"}


def measured_table(runs: dict, cfg) -> str:
    """The tiny model's bytes by role: measured on the real tensors, and the formula."""
    lines = [f"{'setup':18s} {'role':24s} {'measured B':>12s} {'formula B':>12s}  equal   trainable"]
    for name, r in runs.items():
        f, b = F.finetune_states(cfg, _setup(name)), r["bytes"]
        pairs = [("weights + NF4 constants", b["weights"] + b["quant_constants"],
                  f["base_weights"] + f["quant_constants"]),
                 ("adapters", b["adapters"], f["adapter_weights"]), ("gradients", b["grads"], f["grads"]),
                 ("optimizer (all)", b["optimizer"] + b["optimizer_constants"],
                  f["master"] + f["optimizer_moments"] + f["optimizer_scales"] + f["step_counters"])]
        for i, (role, m, fo) in enumerate(pairs):
            tail = f"{r['trainable']:>11,}" if i == 0 else ""
            lines.append(f"{SHOWN.get(name, name) if i == 0 else '':18s} {role:24s} {m:>12,} {fo:>12,}  {'yes' if m == fo else 'NO':5s} {tail}")
    return "\n".join(lines)


def _setup(name: str):
    from gpumem.runs import finetune_run
    return finetune_run.SETUPS[name]


def losses_table(runs: dict) -> str:
    """Each setup's loss per step."""
    lines = [f"{'setup':18s} " + " ".join(f"{'step ' + str(i):>8s}" for i in range(len(runs['full']['losses'])))
             + "   optimizer"]
    for name, r in runs.items():
        lines.append(f"{SHOWN.get(name, name):18s} " + " ".join(f"{v:8.4f}" for v in r["losses"]) + f"   {r['optimizer_class']}")
    return "\n".join(lines)


def scale_table(rows: list[dict]) -> str:
    """Per-GPU GB (one GPU, no sharding): the states the GPU holds, the host RAM a row needs,
    the GPU's total without / with checkpointing, and where it fits: each card's mark is
    no-checkpointing/checkpointing (Y fits, - does not)."""
    cards = list(scale.CARDS)
    head = (f"{'model':14s} {'recipe':22s} {'states':>7s} {'host':>7s} {'no ckpt':>7s} {'ckpt':>7s} "
            + " ".join(f"{scale.CARDS[c][0].split()[-1]:>5s}" for c in cards))
    lines = ["states: bytes on the GPU besides activations; host: CPU RAM (- when none); no ckpt, ckpt:",
             "the GPU's total for a step without / with checkpointing; cards: fits no ckpt/ckpt", "",
             head, f"{'':14s} {'':22s} {'GPU GB':>7s} {'RAM GB':>7s} {'GPU GB':>7s} {'GPU GB':>7s}"]
    for r in rows:
        marks = " ".join(f"{'/'.join('Y' if x else '-' for x in r['fits'][c]):>5s}" for c in cards)
        host = f"{r['host'] / GB:7.1f}" if r.get("host") else f"{'-':>7s}"
        lines.append(f"{r['model']:14s} {r['recipe']:22s} {r['states'] / GB:7.1f} {host} {r['none'] / GB:7.1f} "
                     f"{r['full'] / GB:7.1f} {marks}")
    return "\n".join(lines)


def cards_table() -> str:
    """The four cards: what they report, what a single GPU leaves for tensors, and the source."""
    r = scale.SINGLE
    lines = [f"reserve on one GPU: CUDA context {units.fmt(r.context, 'GiB')} + {r.fragmentation:.0%} of capacity "
             "for fragmentation\n  (no NCCL buffers: one GPU has no communicator)"]
    for c, (label, cap, src) in scale.CARDS.items():
        lines.append(f"  {label:15s} {cap // 2**20:>8,} MiB = {units.fmt(cap, 'GB', 1):>9s}, "
                     f"usable {units.fmt(scale.usable(c), 'GB', 1):>9s}")
        lines.append(f"  {'':15s} source: {src}")
    return "\n".join(lines)


FRAMEWORKS = [
    ("LoRA", "peft LoraConfig(r=16, lora_alpha=32, target_modules=[q_proj, k_proj, v_proj, o_proj,\n"
             "gate_proj, up_proj, down_proj]); get_peft_model(model, config)"),
    ("NF4 base", "transformers BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4',\n"
                 "bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16);\n"
                 "torchao (not pinned here): torchao.dtypes.to_nf4(weight) (dtypes/nf4tensor.py),\n"
                 "blocks of 64, block scales quantised per 256 (same sizes; not bit-equal)"),
    ("QLoRA prep", "peft prepare_model_for_kbit_training(model): norms, embedding, head -> fp32,\n"
                   "enable_input_require_grads, gradient checkpointing on"),
    ("8-bit AdamW", "bitsandbytes.optim.AdamW8bit / PagedAdamW8bit; HF Trainer optim='adamw_bnb_8bit',\n"
                    "'paged_adamw_8bit', 'paged_adamw_32bit'; no 4-bit optimizer in bitsandbytes\n"
                    "0.50.2 (optim_bits 8 or 32); torchao.optim has AdamW4bit (not counted here)"),
    ("DeepSpeed", "ZeRO-3 partitions only what DeepSpeed is handed; frozen bf16 base params are\n"
                  "partitioned too (stage 3 shards all parameters), but grads and optimizer states\n"
                  "exist only for the adapters; QLoRA + ZeRO-3 needs bnb_4bit_quant_storage=bf16"),
    ("FSDP2", "fully_shard(module) per block shards every parameter (frozen or not) as DTensor;\n"
              "grads and AdamW states only for requires_grad=True; QLoRA: quant_storage=bf16 too,\n"
              "and FSDP1 (fsdp_config version 1), the route tested with 4-bit weights (bitsandbytes\n"
              "#1945: wrong outputs reported under FSDP2); bitsandbytes' optimizers fail on DTensor\n"
              "shards (#1403, #1633): torch AdamW with FSDP"),
    ("CPU offload", "frozen base: FSDP1 CPUOffload(offload_params=True); FSDP2 fully_shard(...,\n"
                    "offload_policy=CPUOffloadPolicy()); DeepSpeed ZeRO-3 \"offload_param\": {\"device\":\n"
                    "\"cpu\"} (stage 3 only). Adapters' states only: \"offload_optimizer\" (stage >= 1)"),
    ("Megatron", "Megatron-Bridge (docs/training/peft.md): ConfigContainer(peft=LoRA(target_modules=\n"
                 "[linear_qkv, linear_proj, linear_fc1, linear_fc2], dim=16, alpha=32)): fused qkv and\n"
                 "gate/up (fc1) projections, so four targets cover Llama's seven projections"),
    ("bf16 step", "HF Trainer bf16=True / torch.autocast('cuda', dtype=torch.bfloat16); peft\n"
                  "get_peft_model(..., autocast_adapter_dtype=True) keeps the adapters fp32 (default):\n"
                  "each adapter then saves its own bf16 cast of its input; False on a bf16 model, or\n"
                  "peft.helpers.disable_input_dtype_casting(model), keeps one shared input"),
]


def frameworks_table(width: int = 100) -> str:
    """The switches in each library, side by side."""
    lines = []
    for what, how in FRAMEWORKS:
        first, *rest = how.split("\n")
        lines.append(f"{what:12s} {first}")
        lines += [f"{'':12s} {line}" for line in rest]
    assert max(map(len, lines)) <= width
    return "\n".join(lines)
