"""Chapter 00's quiz: what a GPU's memory really is (what the device reports, less a reserve),
why fewer bytes are free than it reports, and what a fake-tensor trace can tell. GPU figures
come from ``gpumem.memory.gpus``; each attempt draws another GPU (and unit)."""

from gpumem.course.quiz import Choice, Numeric, Quiz
from gpumem.course.quiz_draws import UNIT_MIXUP, gpu_numbers, pick
from gpumem.memory import gpus
from gpumem.units import GB, GiB

REPORTED = ("h100-80gb", "a100-80gb", "a100-40gb", "h200", "l4", "t4")
UNIT = {"GB": GB, "GiB": GiB}


def _capacity(rng) -> dict:
    unit = pick(rng, UNIT)
    return gpu_numbers(pick(rng, REPORTED)) | {
        "unit": unit, "unit_words": "10^9 bytes" if unit == "GB" else "2^30 bytes"}


def _usable(rng) -> dict:
    n, r = gpu_numbers(pick(rng, REPORTED)), gpus.DEFAULT_RESERVE
    return n | {"fixed": r.context + r.nccl, "fixed_gib": (r.context + r.nccl) / GiB,
                "frag": f"{r.fragmentation:.0%}", "frag_bytes": int(r.fragmentation * n["capacity"])}


def _decimal_mib(n: dict) -> float:
    return n["mib"] * 10**6 / UNIT[n["unit"]]


QUIZ = Quiz("00_setup", [
    Numeric("capacity-units",
            "nvidia-smi on one {gpu} reports memory.total = {mib:,} MiB. How much is that in "
            "{unit} ({unit_words}), to one decimal?",
            answer=lambda n: n["capacity"] / UNIT[n["unit"]], unit="GB", rel_tol=0.0, abs_tol=0.0501,
            hint="Go through bytes: 1 MiB = 2^20 = 1,048,576 B; 1 GB = 10^9 B; 1 GiB = 2^30 B.",
            explanation="{mib:,} MiB x 1,048,576 = {capacity:,} B = {capacity_gb:.1f} GB = "
                        "{capacity_gib:.1f} GiB. The name on the box is a rounded label, neither of "
                        "the two: plan against what the device reports, less a reserve.",
            traps=(UNIT_MIXUP,
                   (_decimal_mib, "a MiB is 2^20 = 1,048,576 bytes, not 10^6."),
                   (lambda n: n["mib"] / 1000, "MiB / 1000 mixes a binary prefix with a decimal "
                                               "one; convert to bytes first.")),
            draw=_capacity),
    Numeric("usable-bytes",
            "A training process cannot hand all of a GPU's memory to tensors. The course reserves "
            "{fixed_gib:.0f} GiB for the CUDA context and NCCL buffers together, plus {frag} of the "
            "capacity for allocator fragmentation. One {gpu} reports {mib:,} MiB: how many GB "
            "(10^9 B) are left for model states and activations?",
            answer=lambda n: n["usable"] / GB, unit="GB", rel_tol=0.003,
            hint="Work in bytes: the capacity is {mib:,} x 2^20 B, the fixed part {fixed_gib:.0f} x "
                 "2^30 B, and the fragmentation share is taken of the capacity.",
            explanation="{capacity:,} B - {fixed:,} B - {frag_bytes:,} B ({frag}) = {usable:,} B = "
                        "{usable_gb:.1f} GB usable, against {capacity_gb:.1f} GB reported.",
            traps=((lambda n: (n["capacity"] - n["fixed"]) / GB,
                    "you left out the fragmentation share ({frag} of the capacity)."),
                   (lambda n: n["capacity"] / GB,
                    "that is the whole reported capacity; take the reserve off."),
                   (lambda n: n["usable"] / GiB, "that is the usable size in GiB; the question asks "
                                                 "for GB (10^9 B).")),
            draw=_usable),
    Choice("fewer-free-bytes",
           "nvidia-smi shows an H100 with 81,559 MiB. Right after a training script starts, "
           "torch.cuda.mem_get_info() reports fewer free bytes than 81,559 x 2^20. Which of "
           "these is NOT a reason?",
           ["The CUDA context that the process created on the GPU",
            "Tensors of another process on the same GPU",
            "Device memory the driver keeps for itself",
            "PyTorch counting in GiB where nvidia-smi counts in MiB"],
           answer=3,
           hint="mem_get_info returns a count of bytes. Which option changes how a size is "
                "written rather than how many bytes there are?",
           explanation="A unit changes how a number is written, never the bytes: 81,559 MiB and "
                       "79.6 GiB are the same 85,520,809,984 B. The CUDA context, other processes "
                       "and the driver's share are bytes really taken, which is why the course "
                       "plans against capacity less a reserve."),
    Choice("fake-trace",
           "A fake-tensor trace runs a full Llama-3-70B training step on a laptop: every tensor "
           "has a shape, a dtype and a device, but no data. Which of these can it NOT tell you?",
           ["The bytes of every tensor autograd saves for backward",
            "The peak of allocated bytes during the step",
            "How long the step takes on an H100",
            "When each gradient is freed"],
           answer=2,
           hint="A fake tensor's kernels never run. Which of the four needs them to run?",
           explanation="Shapes and dtypes fix every tensor's bytes, and the order of allocations "
                       "and releases is the real one, so sizes and the peak are exact. Nothing is "
                       "computed, so there is no time to measure: time needs FLOPs at a stated "
                       "utilisation, or a real GPU."),
])
