"""Chapter 00's quiz: units and what the course runs on a laptop."""

from gpumem.course.quiz import Choice, Numeric, Quiz
from gpumem.units import GB, GiB

QUIZ = Quiz("00_setup", [
    Numeric("gib-of-80gb",
            "An H100 is sold as '80 GB' (it holds 80 x 10^9 bytes of HBM, near enough). "
            "How many GiB is that?",
            answer=lambda: 80 * GB / GiB, unit="GiB", rel_tol=0.005,
            explanation="1 GiB = 2^30 = 1.074 x 10^9 bytes, so 80 GB = 74.5 GiB. PyTorch's memory "
                        "reports are in bytes; the course labels every figure GB or GiB."),
    Choice("cpu-real",
           "On a laptop with no GPU, what does this course run?",
           ["Nothing: every experiment needs CUDA",
            "Mocked DeepSpeed calls that print expected numbers",
            "Real DeepSpeed and PyTorch on CPU ranks, and exact traces of full-size steps on fake tensors"],
           answer=2,
           explanation="DeepSpeed runs for real on its CPU accelerator over gloo, and fake tensors let a "
                       "laptop trace a full Llama-3-70B step without allocating its memory."),
])
