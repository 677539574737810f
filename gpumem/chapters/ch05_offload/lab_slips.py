"""Lab 05's slips in pricing a step: the schedule slips' hints, and the drive byte slips' steps.

Review r24 #1: a wrong drive byte count got only "yours is 0.9xx the time engine's stock step".
:func:`drive_slips` recomputes the stock step with one of three likely slips, from the time engine's
own pieces (:func:`~gpumem.memory.offload_cost.traffic_parts`' bytes,
:func:`~gpumem.timing.grad_swap.exposed_seconds`, the step's terms): a learner's step that equals
one of them, within the grader's tolerance, is named by that slip with the bytes per shard
parameter DeepSpeed moves and the learner's.

* the fp32 gradient's read-back left out of the step's drive reads (CPU Adam reads the gradient
  backward wrote: ``partitioned_optimizer_swapper.py``'s ``swap_in_optimizer_state`` reads it
  beside master, m and v);
* the updated 16-bit shard's write-back left out, where the parameters live on the drive
  (``stage3.py``'s ``_reassign_or_swap_out_partitioned_parameters`` -> ``swap_out_partitioned_params``
  in ``partitioned_param_swapper.py``, after each sub-group's update);
* the gradient sent to the drive in bf16: its write, or its write and its read-back, at 2 B an
  element, where ``stage3.py``'s ``_swap_out_offload_fp32_gradients`` writes the fp32 partition the optimizer reads.
"""

from gpumem.memory import accounting, offload_cost
from gpumem.timing import grad_swap, offload_time

# the schedule slips' hints (:func:`~.labcheck.seconds_problem`), none with a count
STREAM = ("the gradient stream is missing or too light: during backward stage_1_and_2.py widens each reduced "
          "gradient slice to fp32 on the GPU before its copy to the host (not the ZeRO-Offload paper's 16-bit "
          "copy), one copy after another on one CUDA stream, beside compute; here it sets the pace")
Z3_STREAM = ("ZeRO-3's gradient stream is missing or too light: during backward stage3.py copies the bf16 "
             "partition down, back up, then an fp32 copy down (not the ZeRO-Offload paper's one 16-bit copy), "
             "one after another on one CUDA stream beside compute; here it sets the pace")


GRAD_SERIAL = ("yours writes the whole fp32 gradient to the drive after backward: DeepSpeed's swapper "
               "(swap_tensor/async_swapper.py) starts writing each full buffer during backward")
GRAD_HIDDEN = ("the fp32 gradient's drive write is missing, or all of it hidden behind backward: the "
               "step waits for what backward's buffers have not written (swap_tensor/async_swapper.py)")
GRAD_UNBOUNDED = ("your gradient write waits too little: in swap_tensor/async_swapper.py a written buffer "
                  "is not free again until backward waits for every write in flight")


NO_COMPUTE = ("yours leaves compute out of what runs beside the transfers: during forward and backward the "
              "copies and fetches run beside compute, so the longer of the two sets that stretch; which is "
              "longer here?")      # review r30 #7
PHASED = ("yours runs forward, then backward: the course's engine runs every transfer of forward and backward "
          "beside all of compute_s, the longest setting the pace (cell 9's stated assumption)")
ONE_MICRO = ("yours is this rung's step for one micro-batch, and this step accumulates gradients over "
             "several: what crosses PCIe again for each further micro-batch (stage3.py 2031-2039; at ZeRO-2 "
             "async_accumulate_grad_in_cpu_via_gpu in stage_1_and_2.py), how often are the parameters "
             "fetched, and during which micro-batch's backward is the fp32 gradient written to the drive?")


NO_UPLOADS = ("yours leaves the PCIe uploads out of the forward and backward window: which bytes go up to the "
              "GPU during forward and backward, and can they outlast the gradient stream?")     # review r35 #1
# review r35 #3: a step that prices only part of the further micro-batches' traffic, named by a question
FETCH_ONCE = ("yours fetches the offloaded parameters once a step: how often do forward and backward fetch the "
              "shard when the step accumulates over several micro-batches?")
UP_ONCE = ("yours brings ZeRO-3's gradient partition back up once a step: in which micro-batches does stage3.py "
           "bring the host buffer up again (2024-2039)?")
Z2_FIRST_UP = ("yours brings ZeRO-2's accumulated gradient up in every micro-batch: what is on the host to bring "
               "up before the first (async_accumulate_grad_in_cpu_via_gpu in stage_1_and_2.py)?")


READ_BACK = ("the fp32 gradient's read-back is missing from the step's drive reads: CPU Adam reads the "
             "gradient backward wrote, beside master and moments (swap_in_optimizer_state in "
             "swap_tensor/partitioned_optimizer_swapper.py)")     # review r28: no byte count, that is the answer
# review r30 #4: the three slips name the missing transfer, as READ_BACK does, not the bytes (the answer)
WRITE_BACK = ("the updated 16-bit shard's write-back is missing from the step's drive writes: with the "
              "parameters on the drive, where does the step leave the shard it updated? (stage3.py's "
              "_reassign_or_swap_out_partitioned_parameters)")
BF16_GRAD = ("your gradient goes to the drive in bf16: which dtype does CPU Adam read it in? (stage3.py's "
             "_swap_out_offload_fp32_gradients)")


def drive_slips(n: int, ranks: int, zero: int, offload: str, device: str, compute_s: float, links,
                t: dict, micro_batches: int = 1) -> list[tuple[float, str]]:
    """(the stock step with one drive slip, its hint) for each slip that changes this rung's step
    (none off the drive); ``t``: the engine's :func:`~gpumem.timing.offload_time.step_time` terms."""
    if device != "nvme" or offload == "none":
        return []
    p = offload_cost.traffic_parts(n, "mixed", zero, ranks, offload, device, micro_batches=micro_batches)
    s = accounting.shard(n, ranks)
    want, grad = t["stock"], p["nvme_grad_write"]
    fp32, bf16 = grad // s, accounting.RECIPE["mixed"].grads
    shard = p["nvme_write"] - p["nvme_state_read"]                 # the 16-bit shard's file
    half = grad_swap.exposed_seconds(s, bf16, links.nvme_write, t["backward"], grad_swap.SUB_GROUP_SIZE,
                                     grad_swap.BUFFER_COUNT)
    in_bf16 = want - t["nvme_grad_exposed"] + half
    out = [(want - grad / links.nvme_read, READ_BACK), (in_bf16, BF16_GRAD),
           (in_bf16 - (fp32 - bf16) * s / links.nvme_read, BF16_GRAD)]
    if shard:
        out.append((want - shard / links.nvme_write, WRITE_BACK))
    return _merged(out)


def _merged(slips: list[tuple[float, str]]) -> list[tuple[float, str]]:
    """``slips`` with those that give the same step told together (a shard of one gradient buffer
    writes all of it after backward: half its bytes and the shard's write-back left out are the
    same 2 B per shard parameter over the write rate)."""
    out: list = []
    for value, words in slips:
        same = next((i for i, (v, _) in enumerate(out) if abs(v - value) <= 1e-6 * max(1e-3, abs(v))), None)
        if same is None:
            out.append((value, words))
        elif words not in out[same][1]:
            out[same] = (out[same][0], f"{out[same][1]}; or {words} (either gives your step)")
    return out


def restep(t: dict, p: dict, s: int, compute_s: float, links, m: int) -> float:
    """The engine's stock step with the bytes ``p`` (:func:`~gpumem.memory.offload_cost.traffic_parts`'
    keys) in place of the step's own, priced as :func:`~gpumem.timing.offload_time.step_time` does."""
    trip = p["grad_down"] / links.d2h + p["grad_up"] / links.h2d
    params = p["nvme_param_read"] / links.nvme_read
    back = grad_swap.backward_seconds(compute_s, trip, (p["grad_up"] + p["param_fetch"] / 2) / links.h2d, params, m)
    shown = grad_swap.exposed_seconds(s, p["nvme_grad_write"] // s, links.nvme_write, back, grad_swap.SUB_GROUP_SIZE,
                                      grad_swap.BUFFER_COUNT) if p["nvme_grad_write"] else 0.0
    h2d = (p["grad_up"] + p["param_fetch"] + p["param_update"]) / links.h2d
    return offload_time.stock_schedule({**t, "h2d": h2d, "grad_trip": trip, "nvme_params": params,
                                        "nvme_grad_exposed": shown})


def micro_slips(n: int, ranks: int, zero: int, offload: str, device: str, compute_s: float, links,
                t: dict, m: int) -> list[tuple[float, str]]:
    """(the stock step with one micro-batch slip, its hint) for this rung with ``m`` > 1 micro-batches
    (review r35 #3): the parameters fetched once a step, ZeRO-3's trip back up priced once, ZeRO-2's
    first micro-batch's gradient brought up too; and the PCIe uploads left out of the window (r35 #1)."""
    if offload == "none":
        return []
    p = offload_cost.traffic_parts(n, "mixed", zero, ranks, offload, device, micro_batches=m)
    s = accounting.shard(n, ranks)
    out = [(offload_time.stock_schedule({**t, "h2d": t["h2d_after"]}), NO_UPLOADS),
           (offload_time.stock_schedule({**t, "h2d": t["h2d"] - p["grad_up"] / links.h2d}), NO_UPLOADS)]
    if m > 1:
        one = offload_cost.traffic_parts(n, "mixed", zero, ranks, offload, device, micro_batches=1)
        fetch = {"param_fetch": one["param_fetch"], "nvme_param_read": one["nvme_param_read"]}
        up = one["grad_up"] if zero == 3 else p["grad_up"] + p["grad_up"] // (m - 1)    # ZeRO-2: 2 B more
        out.append((restep(t, {**p, "grad_up": up}, s, compute_s, links, m), UP_ONCE if zero == 3 else Z2_FIRST_UP))
        if p["param_fetch"]:
            out.append((restep(t, {**p, **fetch}, s, compute_s, links, m), FETCH_ONCE))
    return out
