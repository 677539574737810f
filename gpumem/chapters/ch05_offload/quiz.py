"""Chapter 05's quiz: which link an offloaded state crosses, how long its trips take, what
ZeRO-Infinity writes to the drive, and how many tokens hide the transfers. Each attempt draws a
model, GPU count, GPU or drive; every expected value is computed by the library
(``gpumem.memory.offload_cost``, ``gpumem.memory.accounting``) for the numbers drawn."""

from gpumem.course.quiz import Choice, Numeric, Quiz
from gpumem.course.quiz_draws import LLAMAS, TRAINING_GPUS, gpu_numbers, model_numbers, pick
from gpumem.memory import accounting, gpus, offload_cost

GB = 1e9


def _trip(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS)) | gpu_numbers(pick(rng, TRAINING_GPUS)) | {"gpus": pick(rng, (4, 8, 16, 32))}
    n["pcie"] = gpus.get(n["gpu_name"]).pcie / GB
    n["shard"] = accounting.shard(n["n_params"], n["gpus"])
    return n


def _trip_ms(n: dict) -> float:
    t = offload_cost.offload_traffic(n["n_params"], "mixed", 2, n["gpus"], "optimizer", "cpu")
    return 1e3 * t["d2h"] / (n["pcie"] * GB)


def _nvme(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS)) | {"gpus": pick(rng, (8, 16, 64)), "drive": pick(rng, ("gen3", "gen4", "gen5"))}
    n["write_gbs"] = offload_cost.NVME_DRIVES[n["drive"]][1] / GB
    n["shard"] = accounting.shard(n["n_params"], n["gpus"])
    return n


def _nvme_s(n: dict) -> float:
    t = offload_cost.offload_traffic(n["n_params"], "mixed", 3, n["gpus"], "optimizer+params", "nvme")
    return t["nvme_write"] / (n["write_gbs"] * GB)


def _tokens(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS)) | gpu_numbers(pick(rng, TRAINING_GPUS)) | {"gpus": 8,
                                                                                    "mfu_pct": pick(rng, (30, 40, 50))}
    g = gpus.get(n["gpu_name"])
    n["tflops"], n["pcie"] = g.bf16_flops / 1e12, g.pcie / GB
    n["adam_g"] = round(offload_cost.datasheet_links(n["gpu_name"]).cpu_adam / 1e9, 2)
    n["shard"] = accounting.shard(n["n_params"], n["gpus"])
    return n


def _links(n: dict) -> offload_cost.Links:
    return offload_cost.Links(n["pcie"] * GB, n["pcie"] * GB, 7e9, 7e9, n["adam_g"] * 1e9, "quiz")


def _break_even(n: dict) -> float:
    return offload_cost.break_even_tokens(n["n_params"], "mixed", 3, n["gpus"], "optimizer", "cpu", _links(n),
                                          n["tflops"] * 1e12, n["mfu_pct"] / 100)


def _slowest(n: dict) -> str:
    r = offload_cost.step_time(n["n_params"], "mixed", 3, n["gpus"], "optimizer", "cpu", 0.0, _links(n))
    return max(("h2d", "d2h", "cpu_adam"), key=r.get)


QUIZ = Quiz("05_offload", [
    Choice("which-link",
           "ZeRO-Offload keeps Adam on the CPU. Each step the GPU's gradients go to host memory and the "
           "updated bf16 parameters come back. Which figure limits those two copies on an A100 or H100 "
           "server with PCIe Gen4 host links?",
           ["about 31.5 GB/s per direction: the GPU's PCIe x16 link",
            "about 100 GB/s: host memory seen from the GPU",
            "about 300 GB/s: one DDR5 socket's memory bandwidth",
            "about 450 GB/s: NVLink per direction"],
           0,
           "The bytes leave the GPU through its PCIe link; the CPU's DRAM is ten times faster than that link "
           "and NVLink joins GPUs, not GPU and host. NVIDIA's 64 GB/s counts both directions.",
           hint="Follow one gradient from HBM to the CPU's memory: which link does it cross that it never "
                "crosses on a GPU-only step?"),
    Numeric("grad-trip",
            "{model} ({n_params:,} parameters) trains with the mixed recipe (bf16 weights and gradients, fp32 "
            "master and Adam moments) on {gpus} {gpu}s, ZeRO-2 with the optimizer offloaded to the CPU. "
            "The host link carries {pcie:.2f} GB/s per direction (GB = 10^9 B). How many milliseconds does "
            "one GPU's gradient trip to host memory take per step, if nothing else uses the link?",
            answer=_trip_ms, unit="ms", rel_tol=0.02, draw=_trip,
            hint="Each GPU sends only the gradients of the parameters its optimizer shard owns, in the dtype "
                 "they have on the GPU.",
            explanation="The shard is ceil({n_params:,} / {gpus}) = {shard:,} parameters, 2 bytes each: "
                        "{answer} ms at {pcie:.2f} GB/s. The updated bf16 shard comes back up: the same bytes.",
            traps=((lambda n: 1e3 * 2 * n["n_params"] / (n["pcie"] * GB), "that sends every gradient; ZeRO-2 "
                                                                           "sends only the rank's shard."),
                   (lambda n: 2 * n["expected"], "that counts 4-byte gradients; they are bf16 on the GPU and "
                                                 "become fp32 on the CPU."))),
    Numeric("infinity-writes",
            "{model} ({n_params:,} parameters) trains with ZeRO-Infinity on {gpus} GPUs: stage 3, optimizer "
            "states and parameters on NVMe (mixed recipe: bf16 parameters and gradients, fp32 master, m "
            "and v). Each "
            "GPU's drive writes {write_gbs:.1f} GB/s. How many seconds does each step's write-back of the "
            "rank's swapped states take?",
            answer=_nvme_s, unit="s", rel_tol=0.02, draw=_nvme,
            hint="After the CPU step, the rank writes back every state the drive holds for its shard.",
            explanation="The shard is {shard:,} parameters; the drive holds 12 B of fp32 master, m and v, the "
                        "4 B fp32 gradient the CPU optimizer reads, and 2 B of bf16 parameters for each: 18 B x "
                        "{shard:,} at {write_gbs:.1f} GB/s = {answer} s.",
            traps=((lambda n: 12 * n["shard"] / (n["write_gbs"] * GB), "that writes the optimizer states only; "
                                                                       "ZeRO-Infinity swaps the parameters too."),
                   (lambda n: 14 * n["shard"] / (n["write_gbs"] * GB), "DeepSpeed swaps the fp32 gradients "
                                                                       "out beside the optimizer states too."),
                   (lambda n: 18 * n["n_params"] / (n["write_gbs"] * GB), "that writes the whole model; each "
                                                                          "rank swaps its own shard."))),
    Numeric("hide-the-transfers",
            "{model} ({n_params:,} parameters) trains on {gpus} {gpu}s ({tflops:.0f} TFLOP/s dense bf16, "
            "{mfu_pct} % of it reached), ZeRO-3 with the optimizer on the CPU (mixed recipe). The host link "
            "moves {pcie:.2f} GB/s per direction and each GPU's share of the CPU runs Adam at {adam_g} billion "
            "parameters/s. With perfect overlap, how many tokens must each GPU process per step so that "
            "compute (6 x parameters x tokens FLOPs) takes at least as long as the slowest offload term?",
            answer=_break_even, unit="tokens", rel_tol=0.02,
            draw=lambda rng: (lambda n: n | {"slowest": _slowest(n)})(_tokens(rng)),
            hint="Time each offload term for the rank's shard: gradients down (2 B), parameters up (2 B), Adam "
                 "on the shard. Then ask how many tokens of compute last that long.",
            explanation="The slowest term here is {slowest}; compute of {answer} tokens lasts as long. Fewer "
                        "tokens and the step waits on the offload even when everything overlaps."),
    Numeric("overlap-buys",
            "The note's ZeRO-Offload step: forward + backward 100 ms, parameters up 20 ms, CPU Adam 30 ms, "
            "gradients down 5 ms, summed to 155 ms. If each of the four ran on its own resource, fully "
            "overlapped, how many milliseconds would the step take?",
            answer=lambda: 1e3 * offload_cost.note_example(True)["total"], unit="ms", rel_tol=0.001,
            hint="With perfect overlap the step lasts as long as its longest part.",
            explanation="{answer} ms, the compute. Real schedules sit between: DeepSpeed overlaps the gradient "
                        "trip with backward, and the ZeRO-Offload paper's one-step delayed parameter update "
                        "overlaps the CPU step with the next forward and backward.",
            traps=((lambda n: 155.0, "that is the serial sum: nothing overlapped."),)),
])
