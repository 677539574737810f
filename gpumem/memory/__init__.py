"""The memory engine: what a training step holds, by formula and by exact trace.

Formulas, torch-free (``python -m gpumem estimate`` answers without importing torch):
``models`` (the registry), ``policies`` (kernel and checkpoint names), ``accounting`` (model
states by recipe, ZeRO stage and offload), ``activations`` (tensor by tensor), ``estimate``.

Traced and measured, with torch: ``llama`` (the model), ``optim`` (mixed-precision AdamW),
``tracing`` (MemTracker on fake tensors), ``measure`` (real CPU and CUDA steps), ``crosscheck``
(formula vs trace), ``ds_estimators`` (DeepSpeed's own estimators), ``bench``.

Imports only ``gpumem.units`` and ``gpumem.errors`` from outside; never the course or a chapter.
"""
