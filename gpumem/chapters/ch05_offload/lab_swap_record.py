"""Lab 05's recorded swap files: one training step of the lab's two unseen models under ZeRO-3 with
optimizer and parameters on NVMe (:func:`.lab_runs.swap_run`, 2 CPU ranks, libaio present), each
rank's files (DeepSpeed's folder/name -> bytes) as :func:`gpumem.runs.ds_offload.inventory` read them.

Recorded by running ``launch.run("gpumem.chapters.ch05_offload.lab_runs:swap_run", 2, "cpu",
deepspeed=True, models=labcheck.SWAP_MODELS, ...)``; the grader uses it where libaio is missing, and
``tests/test_lab05_adversarial.py`` checks it equals a live run where libaio exists."""

DEEPSPEED = '0.19.8'
DATE = '2026-12-03'             # UTC, the day of the run
RANKS = [
    {
        'model A, 1 MiB aio blocks': {
            'bfloat16params/0_param.tensor.swp': 1281024,
            'bfloat16params/11_param.tensor.swp': 1281024,
            'optimizer/0_11.tensor.swp': 9670656,
            'optimizer/0_11_gradient_0_640000.tensor.swp': 2560000,
            'optimizer/0_11_gradient_1121760_327680.tensor.swp': 1310720,
            'optimizer/0_11_gradient_1449440_327680.tensor.swp': 1310720,
            'optimizer/0_11_gradient_1777280_640000.tensor.swp': 2560000,
            'optimizer/0_11_gradient_794080_327680.tensor.swp': 1310720,
            'optimizer/exp_avg-0_11.tensor.swp': 9670656,
            'optimizer/exp_avg_sq-0_11.tensor.swp': 9670656,
        },
        'model B, 2 MiB aio blocks': {
            'optimizer/12_23.tensor.swp': 11815936,
            'optimizer/12_23_gradient_0_960512.tensor.swp': 3842048,
            'optimizer/12_23_gradient_1993344_960512.tensor.swp': 3842048,
            'optimizer/exp_avg-12_23.tensor.swp': 11815936,
            'optimizer/exp_avg_sq-12_23.tensor.swp': 11815936,
        },
    },
    {
        'model A, 1 MiB aio blocks': {
            'bfloat16params/0_param.tensor.swp': 1281024,
            'bfloat16params/11_param.tensor.swp': 1281024,
            'optimizer/0_11.tensor.swp': 9670656,
            'optimizer/0_11_gradient_0_640000.tensor.swp': 2560000,
            'optimizer/0_11_gradient_1121760_327680.tensor.swp': 1310720,
            'optimizer/0_11_gradient_1449440_327680.tensor.swp': 1310720,
            'optimizer/0_11_gradient_1777280_640000.tensor.swp': 2560000,
            'optimizer/0_11_gradient_794080_327680.tensor.swp': 1310720,
            'optimizer/exp_avg-0_11.tensor.swp': 9670656,
            'optimizer/exp_avg_sq-0_11.tensor.swp': 9670656,
        },
        'model B, 2 MiB aio blocks': {
            'optimizer/12_23.tensor.swp': 11815936,
            'optimizer/12_23_gradient_0_960512.tensor.swp': 3842048,
            'optimizer/12_23_gradient_1993344_960512.tensor.swp': 3842048,
            'optimizer/exp_avg-12_23.tensor.swp': 11815936,
            'optimizer/exp_avg_sq-12_23.tensor.swp': 11815936,
        },
    },
]
