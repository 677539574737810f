"""Checklist item 5: CPU offload against NVMe offload, how fast each is, and what can be offloaded.

Numbers drawn per attempt: model, recipe, ZeRO stage, GPU count, GPU and NVMe generation. Bytes
left on the GPU and bytes moved to host memory or the drive come from
``gpumem.memory.accounting.model_states``; bytes per link, seconds and the break-even tokens
from ``gpumem.memory.offload_cost`` (datasheet bandwidths, CPU Adam bound by host memory).
"""

from gpumem.course.checklist import Item
from gpumem.course.quiz import Choice, Numeric
from gpumem.course.quiz_draws import LLAMAS, gpu_numbers, model_numbers, pick, recipe_numbers
from gpumem.memory import accounting, gpus
from gpumem.timing import compute, offload_time
from gpumem.units import GB

from . import pointers as P

WHAT = {"optimizer": "the optimizer offloaded to CPU memory (DeepSpeed's offload_optimizer: fp32 master "
                     "weights, AdamW moments and the fp32 gradients they update)",
        "optimizer+params": "the optimizer and the bf16 parameters offloaded to CPU memory (DeepSpeed's "
                            "offload_optimizer and offload_param)"}
# where DeepSpeed 0.19.8 keeps the 16-bit gradients under optimizer offload (accounting.model_states)
GRADS_WHERE = {1: "ZeRO-1 reduces only at the end of backward, so the whole bf16 gradient is on the GPU until then",
               2: "ZeRO-2 widens each reduced bucket's slice to fp32 on the GPU and copies it straight "
                  "to the host, so no gradient partition stays on the GPU",
               3: "ZeRO-3 keeps its bf16 gradient partition in host memory too, beside the fp32 one"}
RECIPES = ("mixed", "mixed-ds")


def _left(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS)) | recipe_numbers(pick(rng, RECIPES))
    n |= {"offload": pick(rng, tuple(WHAT)), "gpus": pick(rng, (8, 16, 32))}
    n["zero"] = 3 if n["offload"] == "optimizer+params" else pick(rng, (1, 2, 3))
    s = accounting.model_states(n["n_params"], n["recipe_name"], n["gpus"], n["zero"], n["offload"])
    plain = accounting.model_states(n["n_params"], n["recipe_name"], n["gpus"], n["zero"])
    return n | {"what": WHAT[n["offload"]], "p_gb": s.params / GB, "g_gb": s.grads / GB,
                "grads_where": GRADS_WHERE[n["zero"]],
                "left_gb": s.total / GB, "plain_gb": plain.total / GB, "host_gb": s.host / GB}


def host_terms(n: dict) -> list[tuple[int, str]]:
    """What one GPU puts in host memory, (bytes, words) per part, as ``accounting.model_states``
    counts it (DeepSpeed 0.19.8, see its docstring); the parts sum to its ``host``."""
    r, sh = accounting.recipe(n["recipe_name"]), accounting.shard(n["n_params"], n["gpus"])
    g_opt = accounting.optimizer_grad_bytes(r)
    terms = [(r.optimizer_bytes * sh, f"{r.optimizer_bytes} B of fp32 master weights and moments"),
             (g_opt * sh, f"{g_opt} B of fp32 gradient for the CPU optimizer")]
    if n["zero"] == 3:
        terms.append((r.params * sh, f"{r.params} B of ZeRO-3's bf16 gradient partition"))
    if n["offload"] == "optimizer+params":
        terms.append((r.params * sh, f"{r.params} B of bf16 parameter shard"))
    return terms


def _host(rng) -> dict:
    n = _left(rng)
    per_node = min(8, n["gpus"])
    return n | {"per_node": per_node, "node_gb": per_node * n["host_gb"]}


def _host_words(n: dict) -> str:
    terms = host_terms(n)
    parts = " + ".join(f"{b / GB:.2f} GB ({w})" for b, w in terms)
    per_b = sum(int(w.split(" B ")[0]) for _, w in terms)
    return (f"Per parameter of its {accounting.shard(n['n_params'], n['gpus']):,}-element shard each GPU "
            f"offloads {per_b} B: {parts} = {sum(b for b, _ in terms) / GB:.2f} GB. {n['grads_where']}. "
            f"{n['per_node']} GPUs per node: {n['answer']} GB. Buffers and the pinned copies DeepSpeed "
            "makes come on top.")


def _nvme(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS)) | gpu_numbers(pick(rng, ("a100-80gb", "h100-80gb", "h200")))
    n |= {"gpus": pick(rng, (8, 16, 64)), "drive": pick(rng, tuple(offload_time.NVME_DRIVES))}
    links = offload_time.datasheet_links(n["gpu_name"], n["drive"])
    s = accounting.model_states(n["n_params"], "mixed", n["gpus"], 3, "optimizer", "nvme")
    t = offload_time.step_time(n["n_params"], "mixed", 3, n["gpus"], "optimizer", "nvme", 0.0, links)
    cpu = offload_time.step_time(n["n_params"], "mixed", 3, n["gpus"], "optimizer", "cpu", 0.0, links)
    busier = max(cpu["d2h"], cpu["h2d"])       # the gradients' 6 B down (DeepSpeed's ZeRO-3 trip)
    return n | {"nvme_gb": s.nvme / GB, "read_gb": links.nvme_read / GB, "write_gb": links.nvme_write / GB,
                "nvme_s": t["nvme"], "pcie_s": busier, "pcie_gb": links.h2d / GB, "ratio": t["nvme"] / busier}


def _bound(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS)) | gpu_numbers(pick(rng, ("a100-80gb", "h100-80gb", "h200")))
    n |= {"gpus": pick(rng, (8, 16, 64)), "offload": pick(rng, tuple(WHAT))}
    g = gpus.get(n["gpu_name"])
    links = offload_time.datasheet_links(n["gpu_name"])
    t = offload_time.step_time(n["n_params"], "mixed", 3, n["gpus"], n["offload"], "cpu", 0.0, links)
    return n | {"what": WHAT[n["offload"]], "shard": accounting.shard(n["n_params"], n["gpus"]),
                "pcie_gb": links.h2d / GB, "adam_g": links.cpu_adam / 1e9, "tflops": g.bf16_flops / 1e12,
                "ups": 2 if n["offload"] == "optimizer+params" else 1,
                "up_words": ("the bf16 parameter shard, which lives in host memory, is copied up twice: "
                             "for forward's gathers and again for backward's"
                             if n["offload"] == "optimizer+params" else
                             "after the update, the shard's new bf16 weights are copied up once into the "
                             "GPU's parameter shard, which stays on the GPU"), "t": t,
                "share_pct": round(100 * compute.KERNEL_SHARE),
                "tokens": offload_time.break_even_tokens(n["n_params"], "mixed", 3, n["gpus"], n["offload"],
                                                         "cpu", links, g.bf16_flops, compute.KERNEL_SHARE)}


def _bound_words(n: dict) -> str:
    t = n["t"]
    slowest = max((t["grad_trip"], "the gradient copies"), (t["h2d"], "the trip up"),
                  (t["cpu_adam"], "CPU Adam"))
    return (f"Per step: the gradient copies {t['grad_trip']:.3f} s (one stream: {t['d2h']:.3f} s down, the "
            f"return up), everything up {t['h2d']:.3f} s, CPU Adam {t['cpu_adam']:.3f} s; the slowest, "
            f"{slowest[1]}, sets the floor, and 6 x {n['n_params']:,} x T / ({n['share_pct'] / 100:g} x "
            f"{n['tflops']:.0f} TFLOP/s) must cover it: T = {n['tokens']:,}.")


QUESTIONS = [
    Numeric("offload-left",
            "{model} ({n_params:,} parameters) trains with {recipe}, under ZeRO-{zero} on {gpus} GPUs, "
            "with {what}. How many GB of model states stay on each GPU?",
            answer=lambda n: n["left_gb"], unit="GB", rel_tol=0.01,
            hint="Start from what ZeRO-{zero} leaves on a GPU per parameter; then take away what lives "
                 "in host memory instead.",
            explanation="Left on the GPU: bf16 parameters {p_gb:.1f} GB and bf16 gradients {g_gb:.1f} GB "
                        "= {answer} GB, against {plain_gb:.1f} GB without offload; {host_gb:.1f} GB per "
                        "GPU now sit in host memory. {grads_where}; the bf16 weights stay (unless "
                        "offloaded) to run forward and backward.",
            traps=((lambda n: n["plain_gb"], "that is without offload."),),
            draw=_left),
    Numeric("offload-host",
            "{model} ({n_params:,} parameters) trains with {recipe}, under ZeRO-{zero} on {gpus} GPUs, "
            "8 GPUs per node, with {what}. How many GB of host memory does one node need for the "
            "offloaded model states of its GPUs?",
            answer=lambda n: n["node_gb"], unit="GB", rel_tol=0.01,
            hint="What does one GPU keep on the host, per parameter of its shard? The optimizer's "
                 "gradient counts too. Then add up the GPUs of one node.",
            explanation=_host_words,
            traps=((lambda n: n["host_gb"], "that is one GPU's share; the node hosts {per_node} of them."),),
            draw=_host),
    Numeric("offload-nvme-seconds",
            "{model} ({n_params:,} parameters, standard mixed precision) trains under ZeRO-3 on "
            "{gpus} {gpu}s with the optimizer on NVMe: {nvme_gb:.3f} GB per GPU of fp32 master weights, "
            "moments and the fp32 gradients they update. Every step reads them all into host memory and "
            "writes them back, each GPU with its own drive "
            "({read_gb:.2f} GB/s read, {write_gb:.2f} GB/s write). How many seconds of drive "
            "traffic is that per step?",
            answer=lambda n: n["nvme_s"], unit="s", rel_tol=0.01,
            hint="How many times per step do the states cross the drive, and at which speed each way?",
            explanation="{nvme_gb:.3f} GB / {read_gb:.2f} GB/s + {nvme_gb:.3f} GB / {write_gb:.2f} GB/s = "
                        "{answer} s. With the states in CPU memory the step moves gradients down and "
                        "weights up over PCIe ({pcie_gb:.1f} GB/s per direction; DeepSpeed's ZeRO-3 sends 6 "
                        "bytes per shard parameter down): {pcie_s:.3f} s on the busier direction, "
                        "{ratio:.0f}x less than the drive. NVMe buys capacity, not speed.",
            traps=((lambda n: n["nvme_gb"] / n["read_gb"], "the states are written back after the "
                                                           "update, too."),),
            draw=_nvme),
    Numeric("offload-break-even",
            "{model} ({n_params:,} parameters, standard mixed precision) trains under ZeRO-3 on "
            "{gpus} {gpu}s with {what}; each GPU owns a shard of {shard:,} parameters. Per step, as "
            "DeepSpeed 0.19.8 runs it, each GPU copies its bf16 gradient shard to a host buffer, back "
            "up, and its fp32 widening down (one copy after another on one stream); the CPU updates "
            "the shard with AdamW at {adam_g:.3f} billion parameters per second per GPU (the node's 8 "
            "GPUs share its CPUs); and {up_words}. "
            "PCIe moves {pcie_gb:.1f} GB/s each way at once. Compute is 6 FLOPs per parameter per "
            "token at {share_pct} % of {tflops:.0f} TFLOP/s. If everything overlaps perfectly, below "
            "how many tokens per GPU per step is the step limited by offloading rather than by compute?",
            answer=lambda n: n["tokens"], unit="tokens", rel_tol=0.01,
            hint="Work out each transfer and the CPU update in seconds; the slowest sets a floor on the "
                 "step time. Which token count makes the compute that long?",
            explanation=_bound_words,
            draw=_bound),
    Choice("offload-what",
           "Which of these DeepSpeed set-ups does not exist?",
           ["ZeRO-2 with the optimizer states in CPU memory",
            "ZeRO-3 with parameters and optimizer states on NVMe",
            "ZeRO-2 with the optimizer states on NVMe",
            "ZeRO-3 with the optimizer in CPU memory, parameters on the GPU"],
           answer=2,
           hint="For each stage, which offload targets and which states does DeepSpeed support?",
           explanation="NVMe offload (ZeRO-Infinity) is a stage-3 feature; stages 1 and 2 can offload "
                       "the optimizer to CPU memory only (ZeRO-Offload), and parameters can be "
                       "offloaded only under stage 3. Activations are not offloaded by these switches: "
                       "checkpointing is what shrinks them."),
    Choice("offload-adam",
           "With ZeRO-Offload (optimizer states in CPU memory), where does the AdamW update run?",
           ["On the GPU, after the states are copied up for the step",
            "On the CPU, on the shard kept in host memory",
            "On the GPU, reading the states from pinned host memory",
            "On the GPU for the moments, on the CPU for the weights"],
           answer=1,
           hint="What would cross PCIe every step if the update ran on the GPU, and what if it ran where "
                "the states live?",
           explanation="The CPU runs AdamW where the 12 bytes per parameter already live, so only the "
                       "gradients (down: fp32, which DeepSpeed 0.19.8 widens on the GPU; at ZeRO-3 after "
                       "a bf16 round trip through a host buffer, 6 bytes down and 2 up) and the bf16 "
                       "weights (up) cross PCIe. Copying the states to the GPU and back would move 24 "
                       "bytes per parameter per step; reading them over PCIe from pinned memory would "
                       "move the same bytes, only without the copy."),
]

ITEM = Item("offload", "CPU versus NVMe offload: their speeds, and what can be offloaded", QUESTIONS, {
    "offload-left": (P.WHO_HOLDS,),
    "offload-host": (P.DS_ESTIMATORS,),
    "offload-nvme-seconds": (P.DS_ESTIMATORS,),
    "offload-break-even": (P.DS_ESTIMATORS,),
    "offload-what": (P.ZERO_FRAMEWORKS,),
    "offload-adam": (P.ZERO_FRAMEWORKS,),
})
