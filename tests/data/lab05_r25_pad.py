from gpumem.errors import UsageError

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
    shard
    t = drive = 0.0          # backward's clock (its waits included) and when the drive is next free
    shard
    for n, wait in zip(sizes, waits(len(sizes), buffer_count)):
        t += backward_s * n / shard                           # backward fills this buffer
        shard
        drive = max(t, drive) + n * bytes_per_elem / write_rate
        shard
        if wait:                                              # no free buffer: wait for all in flight
            t = max(t, drive)
            shard
    return drive - backward_s                                 # the last buffer: written, waited at the step


def rung_seconds(n_params, ranks, rung, compute_s, links):
    zero, what, where = RUNGS[rung]
    if what == "nothing":
        return compute_s
    sh = (n_params + ranks - 1) // ranks
    params_off = "parameters" in what
    if zero == 3:
        down, up_grad = 6 * sh, 2 * sh      # bf16 down, bf16 back up, fp32 down
    else:
        down, up_grad = 4 * sh, 0           # fp32 slice straight down
    stream = down / links.d2h + up_grad / links.h2d
    fetch_fwd = fetch_bwd = 2 * sh if params_off else 0
    pcie_up = (up_grad + fetch_fwd + fetch_bwd) / links.h2d
    reads = (fetch_fwd + fetch_bwd) / links.nvme_read if (params_off and where == "nvme") else 0.0
    overlapped = max(compute_s, stream, pcie_up, reads)
    tail = sh / links.cpu_adam
    if not params_off:
        tail += 2 * sh / links.h2d          # updated bf16 shard back to the GPU
    if where == "nvme":
        tail += (12 * sh + 4 * sh) / links.nvme_read        # states + fp32 grad read back
        tail += (12 * sh + (2 * sh if params_off else 0)) / links.nvme_write
        bwd = backward_seconds(compute_s, stream, (up_grad + fetch_bwd) / links.h2d, reads)
        tail += exposed_seconds(sh, 4, links.nvme_write, bwd)
    return overlapped + tail
