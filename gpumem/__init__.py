"""gpumem: the library behind the *Fitting 70B* course.

Every number the notebooks show is computed here. Modules are named by topic:

- ``units``       bytes, GB (10^9) and GiB (2^30), parsing sizes such as "80GB"
- ``models``      the model registry (Llama-3 8B/70B, Llama-3.1 405B, tiny teaching models)
- ``llama``       a compact Llama implementation (GQA, SwiGLU, RMSNorm, three attention kernels)
- ``errors``      the one error type for bad user input (the CLI turns it into exit status 2)
- ``envcheck``    what is installed and what works on this machine
- ``dsops``       DeepSpeed CPU ops: the course's JIT cache, stale-lock clean-up, prebuild
- ``labgen`` and ``grading``   labs generated from solutions; ``check()`` helpers
- ``quiz``        questions as data, widgets or plain text, saved progress

Import submodules explicitly (``from gpumem import models``); importing ``gpumem`` itself
does nothing else.
"""

__version__ = "0.1.0"
