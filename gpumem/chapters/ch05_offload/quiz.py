"""Chapter 05's quiz: which link binds a ZeRO-Infinity parameter read, how long DeepSpeed's gradient
trip takes, what ZeRO-Infinity writes to the drive per step, how many tokens hide the transfers,
and what a schedule (delayed update or stock DeepSpeed) makes of a step. Each attempt draws a
model, GPU count, GPU, drive or step terms; every expected value is computed by the library
(``gpumem.memory.offload_cost``, ``gpumem.memory.accounting``) for the numbers drawn."""

from gpumem.course.quiz import Numeric, Quiz
from gpumem.course.quiz_draws import LLAMAS, TRAINING_GPUS, gpu_numbers, model_numbers, pick
from gpumem.memory import accounting, gpus, offload_cost
from gpumem.timing import offload_time

GB = 1e9


# how DeepSpeed 0.19.8 sends the gradients down, by stage (offload_cost.gradient_trip's sources)
_TRIP_WORDS = {2: "ZeRO-1/2 widens each reduced slice to fp32 on the GPU and copies it down once: 4 bytes "
                  "each",
               3: "ZeRO-3 copies the bf16 partition into a host buffer (2 bytes), brings it back to the GPU, "
                  "widens it to fp32 there and copies that down (4 bytes): 6 bytes down each, and 2 back up"}


def _trip(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS)) | gpu_numbers(pick(rng, TRAINING_GPUS)) | {"gpus": pick(rng, (4, 8, 16, 32))}
    n["pcie"] = gpus.get(n["gpu_name"]).pcie / GB
    n["shard"] = accounting.shard(n["n_params"], n["gpus"])
    n["zero"] = pick(rng, (2, 3))
    n["how"] = _TRIP_WORDS[n["zero"]]
    return n


def _trip_ms(n: dict) -> float:
    t = offload_cost.offload_traffic(n["n_params"], "mixed", n.get("zero", 2), n["gpus"], "optimizer", "cpu")
    return 1e3 * t["d2h"] / (n["pcie"] * GB)


def _nvme(rng) -> dict:
    n = model_numbers(pick(rng, LLAMAS)) | {"gpus": pick(rng, (8, 16, 64)), "drive": pick(rng, ("gen3", "gen4", "gen5"))}
    n["write_gbs"] = offload_time.NVME_DRIVES[n["drive"]][1] / GB
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
    n["adam_g"] = round(offload_time.datasheet_links(n["gpu_name"]).cpu_adam / 1e9, 2)
    n["shard"] = accounting.shard(n["n_params"], n["gpus"])
    return n


def _links(n: dict) -> offload_time.Links:
    return offload_time.Links(n["pcie"] * GB, n["pcie"] * GB, 7e9, 7e9, n["adam_g"] * 1e9, "quiz")


def _break_even(n: dict) -> float:
    return offload_time.break_even_tokens(n["n_params"], "mixed", 3, n["gpus"], "optimizer", "cpu", _links(n),
                                          n["tflops"] * 1e12, n["mfu_pct"] / 100)


def _slowest(n: dict) -> str:
    r = offload_time.step_time(n["n_params"], "mixed", 3, n["gpus"], "optimizer", "cpu", 0.0, _links(n))
    return max(("h2d", "d2h", "cpu_adam"), key=r.get)


def _offload_terms(rng) -> dict:
    n = _tokens(rng)
    r = offload_time.step_time(n["n_params"], "mixed", 3, n["gpus"], "optimizer", "cpu", 0.0, _links(n))
    n["hbm_tb"] = gpus.get(n["gpu_name"]).hbm / 1e12
    return n | {"slowest": _slowest(n), "serial_s": r["h2d"] + r["d2h"] + r["cpu_adam"],
                "slowest_s": max(r["h2d"], r["d2h"], r["cpu_adam"])}


def _read(rng) -> dict:
    n = _trip(rng) | {"drive": pick(rng, ("gen3", "gen4", "gen5"))}
    n["read_gbs"] = offload_time.NVME_DRIVES[n["drive"]][0] / GB
    n["binds"] = "the NVMe drive" if n["read_gbs"] < n["pcie"] else "the PCIe link"
    return n


def _read_s(n: dict) -> float:
    # backward's share of the parameter fetches: half of ZeRO-Infinity's (forward + backward)
    t = offload_cost.traffic_parts(n["n_params"], "mixed", 3, n["gpus"], "optimizer+params", "nvme")
    return t["param_fetch"] / 2 / (min(n["read_gbs"], n["pcie"]) * GB)


_SCHEDULES = {True: "It uses the ZeRO-Offload paper's one-step delayed parameter update, so all four run at "
                    "once on their own resources, fully overlapped.",
              False: "It runs as stock DeepSpeed does: the gradient copies overlap backward, CPU Adam starts "
                     "when backward ends, and the parameters go up when Adam ends."}


def _schedule(rng) -> dict:
    n = {"compute": pick(rng, (300, 400, 500, 600, 800)), "d2h": pick(rng, (20, 40, 60)),
         "adam": pick(rng, (150, 250, 350, 900)), "h2d": pick(rng, (20, 30, 60)), "dpu": pick(rng, (True, False))}
    n["schedule"] = _SCHEDULES[n["dpu"]]
    return n


def _schedule_ms(n: dict, dpu=None) -> float:
    terms = {"compute": n["compute"], "d2h": n["d2h"], "cpu_adam": n["adam"], "h2d": n["h2d"], "nvme": 0}
    return max(terms.values()) if (n["dpu"] if dpu is None else dpu) else offload_time.stock_schedule(terms)


QUIZ = Quiz("05_offload", [
    Numeric("infinity-read",
            "{model} ({n_params:,} parameters) trains with ZeRO-Infinity on {gpus} {gpu}s (stage 3, mixed "
            "recipe, parameters and optimizer states on NVMe, one drive per GPU). In backward each GPU reads "
            "its bf16 parameter shard back: from its drive ({read_gbs:.2f} GB/s read) into host DRAM, then "
            "over its PCIe link ({pcie:.2f} GB/s per direction) into HBM, the two streaming at once through "
            "staging buffers. How many seconds does backward's read of the shard take?",
            answer=_read_s, unit="s", rel_tol=0.02, draw=_read,
            hint="List the links one byte crosses on its way from the drive to HBM; when they stream at once, "
                 "which one sets the pace?",
            explanation="The shard is {shard:,} parameters, 2 bytes each. The bytes cross the drive, host DRAM "
                        "and PCIe; streamed, the slowest link binds, here {binds}: {answer} s.",
            traps=((lambda n: 2 * n["shard"] / (n["pcie"] * GB), "that is the PCIe time; the slower link sets "
                                                                 "the pace."),
                   (lambda n: 2 * n["shard"] / (n["read_gbs"] * GB) + 2 * n["shard"] / (n["pcie"] * GB),
                    "that waits for the whole shard on one link before the other starts; the staging buffers "
                    "let both stream at once."),
                   (lambda n: 4 * n["shard"] / (min(n["read_gbs"], n["pcie"]) * GB),
                    "that counts forward's read too; the question asks for backward's."))),
    Numeric("grad-trip",
            "{model} ({n_params:,} parameters) trains with the mixed recipe (bf16 weights and gradients, fp32 "
            "master and Adam moments) on {gpus} {gpu}s, ZeRO-{zero} with the optimizer offloaded to the CPU, "
            "as DeepSpeed 0.19.8 runs it. The host link carries {pcie:.2f} GB/s per direction (GB = 10^9 B). "
            "For how many milliseconds per step do one GPU's gradients keep the link's GPU-to-host direction "
            "busy, if nothing else uses it (one micro-batch per step)?",
            answer=_trip_ms, unit="ms", rel_tol=0.02, draw=_trip,
            hint="Each GPU sends only the gradients of the parameters its optimizer shard owns. Which copies "
                 "does DeepSpeed's ZeRO-{zero} make of them on the way to the CPU optimizer, and in which dtype?",
            explanation="The shard is ceil({n_params:,} / {gpus}) = {shard:,} parameters. DeepSpeed's {how} "
                        "(stage_1_and_2.py, stage3.py partition_grads): {answer} ms down at {pcie:.2f} GB/s. "
                        "The ZeRO-Offload paper's design sends the 2-byte gradients once at every stage.",
            traps=((lambda n: 1e3 * 4 * n["n_params"] / (n["pcie"] * GB), "that sends every gradient; each GPU "
                                                                           "sends only its shard."),
                   (lambda n: 1e3 * 2 * n["shard"] / (n["pcie"] * GB),
                    "that counts 2-byte gradients sent once, the ZeRO-Offload paper's design; DeepSpeed 0.19.8 "
                    "sends fp32 gradients down (at ZeRO-3 after a bf16 round trip)."),
                   (lambda n: 1e3 * 4 * n["shard"] / (n["pcie"] * GB) if n["zero"] == 3 else -1.0,
                    "that is the fp32 copy alone; at ZeRO-3 the bf16 partition went down first."),
                   (lambda n: 1e3 * 8 * n["shard"] / (n["pcie"] * GB) if n["zero"] == 3 else -1.0,
                    "that adds the 2 bytes coming back up; they use the other direction of the link."))),
    Numeric("infinity-writes",
            "{model} ({n_params:,} parameters) trains with ZeRO-Infinity on {gpus} GPUs: stage 3, optimizer "
            "states and parameters on NVMe (mixed recipe: bf16 parameters and gradients, fp32 master, m "
            "and v). Each "
            "GPU's drive writes {write_gbs:.1f} GB/s. How many seconds per step does the drive spend "
            "writing, counting every write of the step (backward's and the optimizer step's)?",
            answer=_nvme_s, unit="s", rel_tol=0.02, draw=_nvme,
            hint="Which states does backward write to the drive, and which does the optimizer step write back?",
            explanation="The shard is {shard:,} parameters. Backward swaps out the 4 B fp32 gradient the CPU "
                        "optimizer reads; the step writes back 12 B of fp32 master, m and v and 2 B of updated "
                        "bf16 parameters: 18 B x {shard:,} at {write_gbs:.1f} GB/s = {answer} s.",
            traps=((lambda n: 12 * n["shard"] / (n["write_gbs"] * GB), "that writes the optimizer states only; "
                                                                       "ZeRO-Infinity swaps the parameters too."),
                   (lambda n: 14 * n["shard"] / (n["write_gbs"] * GB), "that leaves out backward's writes: "
                                                                       "DeepSpeed swaps the fp32 gradients out too."),
                   (lambda n: 18 * n["n_params"] / (n["write_gbs"] * GB), "that writes the whole model; each "
                                                                          "rank swaps its own shard."))),
    Numeric("hide-the-transfers",
            "{model} ({n_params:,} parameters) trains on {gpus} {gpu}s ({tflops:.0f} TFLOP/s dense bf16, "
            "{mfu_pct} % of it reached; HBM {hbm_tb:.2f} TB/s), ZeRO-3 with the optimizer on the CPU (mixed "
            "recipe), as DeepSpeed 0.19.8 moves the bytes. The host link moves {pcie:.2f} GB/s per "
            "direction and each GPU's share of the CPU runs Adam at {adam_g} billion parameters/s. The "
            "schedule overlaps everything (the ZeRO-Offload paper's one-step delayed parameter update). "
            "How many tokens must each GPU process per step so that the step never waits on the offload?",
            answer=_break_even, unit="tokens", rel_tol=0.02, draw=_offload_terms,
            hint="Time each offload term for the rank's shard as DeepSpeed's ZeRO-3 moves it: gradients down, "
                 "parameters up, Adam on the shard. With everything overlapped, which one must the compute "
                 "cover, and what does a token of training cost?",
            explanation="The slowest term here is {slowest}; compute of {answer} tokens (6 FLOPs per parameter "
                        "per token at {mfu_pct} % of {tflops:.0f} TFLOP/s) lasts as long. Fewer tokens and the "
                        "step waits on the offload even when everything overlaps. HBM plays no part.",
            traps=((lambda n: n["expected"] * n["serial_s"] / n["slowest_s"],
                    "that covers the terms one after another; with the delayed update they overlap."),
                   (lambda n: 3 * n["expected"], "a token of training is forward and backward: 6 FLOPs per "
                                                  "parameter, not 2."),
                   (lambda n: n["expected"] * 100 / n["mfu_pct"],
                    "the GPU reaches {mfu_pct} % of its peak, so a token takes longer than at peak."))),
    Numeric("schedule",
            "An offloaded step on one GPU: forward + backward {compute} ms, gradient copies down {d2h} ms, "
            "CPU Adam {adam} ms, parameters up {h2d} ms. {schedule} How many milliseconds does the step take?",
            answer=_schedule_ms, unit="ms", rel_tol=0.001, draw=_schedule,
            hint="Which terms can run while the GPU computes, and which must wait for the one before them?",
            explanation="{answer} ms. With the delayed update the longest term sets the step; stock DeepSpeed "
                        "hides only the gradient copies behind backward and runs Adam and the upload after it.",
            traps=((lambda n: n["compute"] + n["d2h"] + n["adam"] + n["h2d"], "that is the serial sum: even "
                                                                              "stock DeepSpeed copies gradients "
                                                                              "during backward."),
                   (lambda n: _schedule_ms(n, not n["dpu"]), "that is the other schedule's step."))),
])
