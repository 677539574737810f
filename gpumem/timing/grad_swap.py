"""How much of backward's fp32 gradient write to NVMe a step waits for (torch-free).

With the optimizer on NVMe, ZeRO-3 writes each rank's fp32 gradient partition to the drive during
backward (``stage3.py`` ``partition_grads`` -> ``_swap_out_offload_fp32_gradients`` ->
``swap_out_gradients``, at the gradient-accumulation boundary: the last micro-batch's backward).
The writes go through DeepSpeed 0.19.8's ``AsyncTensorSwapper`` (``swap_tensor/async_swapper.py``):

* it holds ``buffer_count`` pinned buffers (``offload_optimizer.buffer_count``, default 4:
  ``zero/offload_config.py``), each the size of the rank's largest optimizer sub-group partition
  (``largest_numel``, ``stage3.py``: a sub-group closes once its partition reaches
  ``sub_group_size`` elements, default 1e9: ``zero/config.py``);
* gradients are copied into the current buffer; when it is full and a free buffer remains, the
  full one is written asynchronously and backward goes on (``_make_swap_space`` ->
  ``_flush_ready_buffers``);
* when no free buffer remains, the full one is written and backward waits for *every* write in
  flight (``_flush_buffers_until_complete``): a buffer comes back only at such a wait, so this
  happens every ``buffer_count`` buffers however fast the drive is;
* the last buffer is written when the step begins (``swap_in_optimizer_state`` ->
  ``_flush_gradient_swapper``), and the step waits for it.

So when the rank's whole gradient fits in one buffer (a shard of at most ``sub_group_size``
elements) nothing is written during backward and the whole write is serial; with many buffers
and a fast drive only the last buffer's write shows. :func:`exposed_seconds` replays that rule.

How long backward lasts (:func:`backward_seconds`, review r22 of lab 05: a transfer slower than
compute stretches it, and a longer backward hides more of the write): as long as the slowest thing
in it, its compute (:data:`BACKWARD_SHARE` of forward + backward, 4 of 6 N FLOPs per token), the
gradients' copies on their stream, its PCIe uploads (the gradients' trip back up and half of the
parameter fetches: forward and backward fetch once each) and its half of the drive's parameter
reads; with several micro-batches, the last one's share (1/m of each).

Assumptions (stated, not measured): backward produces the gradient at a steady rate; each
buffer is exactly ``min(shard, sub_group_size)`` elements (DeepSpeed's is up to one parameter's
partition larger); the drive writes at its sequential rate while it also serves ZeRO-Infinity's
parameter reads (optimistic for the rung with parameters on NVMe).
"""

from ..errors import UsageError

SUB_GROUP_SIZE = 1_000_000_000    # zero_optimization.sub_group_size, DeepSpeed 0.19.8's default (zero/config.py)
BUFFER_COUNT = 4                  # offload_optimizer.buffer_count, its default (zero/offload_config.py)
BACKWARD_SHARE = 4 / 6            # backward's share of forward + backward FLOPs (2 N + 4 N per token)


def backward_seconds(compute_s: float, trip_s: float, up_s: float, reads_s: float,
                     micro_batches: int = 1) -> float:
    """The last micro-batch's backward: the slowest of its compute (:data:`BACKWARD_SHARE` of
    ``compute_s``), the gradient stream (``trip_s``), its PCIe uploads (``up_s``: the gradients'
    trip back up and half of the parameter fetches) and half of the drive's parameter reads
    (``reads_s``, forward's and backward's), each over ``micro_batches``."""
    return max(compute_s * BACKWARD_SHARE, trip_s, up_s, reads_s / 2) / micro_batches


def buffers(shard: int, sub_group_size: int = SUB_GROUP_SIZE) -> list[int]:
    """Elements in each buffer the rank's gradient fills, in order: full buffers of
    ``min(shard, sub_group_size)`` elements, the last one holding the rest."""
    if shard <= 0 or sub_group_size <= 0:
        raise UsageError(f"shard and sub_group_size must be > 0 elements, got {shard!r}, {sub_group_size!r}")
    size = min(shard, sub_group_size)
    full, rest = divmod(shard, size)
    return [size] * full + ([rest] if rest else [])


def waits(count: int, buffer_count: int = BUFFER_COUNT) -> list[bool]:
    """For each of ``count`` buffers backward fills, in order: does backward wait for every write in
    flight once that buffer is full? (Every ``buffer_count``-th buffer; the last one is written and
    waited for at the step, so it is not counted.)"""
    return [i < count - 1 and (i + 1) % buffer_count == 0 for i in range(count)]


def exposed_seconds(shard: int, bytes_per_elem: int, write_rate: float, backward_s: float,
                    sub_group_size: int = SUB_GROUP_SIZE, buffer_count: int = BUFFER_COUNT) -> float:
    """Seconds the step spends on the gradient write beyond backward's own compute: backward's
    waits for the drive plus the last buffer's write after it (at least that write). Backward fills
    the buffers at a steady rate over ``backward_s``; the drive writes one buffer at a time at
    ``write_rate`` bytes/s (see the module's rule)."""
    if buffer_count < 1 or write_rate <= 0 or backward_s < 0:
        raise UsageError(f"need buffer_count >= 1, write_rate > 0 and backward_s >= 0, got "
                         f"{buffer_count!r}, {write_rate!r}, {backward_s!r}")
    sizes = buffers(shard, sub_group_size)
    t = drive = 0.0          # backward's clock (its waits included) and when the drive is next free
    for n, wait in zip(sizes, waits(len(sizes), buffer_count)):
        t += backward_s * n / shard                           # backward fills this buffer
        drive = max(t, drive) + n * bytes_per_elem / write_rate
        if wait:                                              # no free buffer: wait for all in flight
            t = max(t, drive)
    return drive - backward_s                                 # the last buffer: written, waited at the step
