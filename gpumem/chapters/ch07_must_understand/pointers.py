"""Where each answer of the checklist is shown: a notebook and one of its section headings.

Every question's explanation ends with one or more of these; ``tests/test_07_must_understand.py``
checks that each heading exists in its notebook, so a renamed section fails a test instead of
sending the learner nowhere.
"""

from gpumem.course.checklist import Pointer

# chapter 01: memory anatomy
RECIPES = Pointer("01_memory_anatomy", "2 · Recipes: what a parameter costs")
ACTIVATIONS = Pointer("01_memory_anatomy", "3 · Activations, tensor by tensor")
# chapter 02: ZeRO
ZERO_PROBLEM = Pointer("02_zero", "The problem, in numbers")
COLLECTIVES = Pointer("02_zero", "The collectives")
WHO_HOLDS = Pointer("02_zero", "Who holds which shard when")
ZERO12_PEAK = Pointer("02_zero", "Where ZeRO-1 and ZeRO-2 differ: the peak during backward")
GATHER_TRACE = Pointer("02_zero", "ZeRO-3 inside DeepSpeed: the gather trace")
WORKING_SET = Pointer("02_zero", "The working set a ZeRO-3 rank holds")
ZERO3_TIME = Pointer("02_zero", "At scale: when ZeRO-3 costs time")
ZERO_FRAMEWORKS = Pointer("02_zero", "In the frameworks people use")
# chapter 03: activation checkpointing
CKPT_IDEA = Pointer("03_activation_checkpointing", "2 · The idea")
CKPT_MEASURED = Pointer("03_activation_checkpointing", "4 · Measured: bytes and FLOPs on the CPU")
CKPT_SCALE = Pointer("03_activation_checkpointing", "6 · At scale: 8B, 70B, 405B")
CKPT_CLAIMS = Pointer("03_activation_checkpointing", "8 · The note's claims")
DS_ESTIMATORS = Pointer("02_zero", "DeepSpeed's own estimators")
# chapter 04: FlashAttention
FLASH_PROBLEM = Pointer("04_flash_attention", "1 · The problem in numbers")
FLASH_IDEA = Pointer("04_flash_attention", "2 · The idea")
FLASH_MECHANISM = Pointer("04_flash_attention", "3 · The mechanism")
FLASH_MEASURED = Pointer("04_flash_attention", "4 · Measured: naive, SDPA and tiled on the CPU")
FLASH_TIME = Pointer("04_flash_attention", "5 · Time, not only memory")
FLASH_SCALE = Pointer("04_flash_attention", "6 · At scale: what FlashAttention keeps, and what GQA shrinks")
# chapter 05: offload
OFFLOAD_PROBLEM = Pointer("05_offload", "1 · The problem in numbers")
OFFLOAD_IDEA = Pointer("05_offload", "2 · The idea")
OFFLOAD_MECHANISM = Pointer("05_offload", "3 · The mechanism, shown")
OFFLOAD_DEEPSPEED = Pointer("05_offload", "4.2 Real DeepSpeed offload on two CPU ranks")
OFFLOAD_COST = Pointer("05_offload", "5 · A cost model, and the step at scale")
OFFLOAD_FRAMEWORKS = Pointer("05_offload", "7 · In the frameworks")
# chapter 06: combining strategies
SCENARIOS = Pointer("06_combining_strategies", "6 · At scale: the note's three scenarios")
SELECTION = Pointer("06_combining_strategies", "7 · Slow or fast interconnect: the note's selection rules, tested")
PLAN_CLAIMS = Pointer("06_combining_strategies", "10 · The note's claims")
# chapter 08: fine-tuning
FINETUNE_SCALE = Pointer("08_finetuning", "5. At scale")

# Where item 5's answers are shown, by question id (the quiz module applies it to the offload
# item, whose questions live in ``offload_items``).
OFFLOAD_SEE = {
    "offload-left": (OFFLOAD_PROBLEM, OFFLOAD_DEEPSPEED),
    "offload-host": (OFFLOAD_PROBLEM, OFFLOAD_DEEPSPEED),
    "offload-nvme-seconds": (OFFLOAD_IDEA, OFFLOAD_COST),
    "offload-break-even": (OFFLOAD_COST,),
    "offload-what": (OFFLOAD_FRAMEWORKS, ZERO_FRAMEWORKS),
    "offload-adam": (OFFLOAD_IDEA, OFFLOAD_MECHANISM),
}
