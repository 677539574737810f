"""Lab 05's recorded swap files: one training step of every model that
:func:`.lab_swaps.recorded_models` may draw (:data:`.lab_swaps.FAMILY`) under ZeRO-3 with
optimizer and parameters on NVMe (:func:`.lab_runs.swap_run`, 2 CPU ranks, libaio present). Both
ranks wrote the same files; kept per role: how many, and a digest of their sizes
(:func:`.lab_swaps.digest`), so that this module is no answer to import.

Recorded by running ``launch.run("gpumem.chapters.ch05_offload.lab_runs:swap_run", 2, "cpu",
deepspeed=True, models=lab_swaps.family(), ...)`` (66 s on 2 cores); the grader uses it where libaio
is missing, and ``tests/test_lab05_adversarial.py`` checks it against a live run where libaio exists."""

DEEPSPEED = '0.19.8'
DATE = '2026-12-03'             # UTC, the day of the run
DIGESTS = {'model A0 (352 wide), 1 MiB aio blocks': {'grads': (5, 'b73aaa3f0c3a8070098a75dd09acc846'),
                                           'master': (1, '2a3a428160a5a54d982ae4c8ee082f0e'),
                                           'optimizer': (2, '80417cc58a4f71cd93f24f854c3eb43d'),
                                           'params': (2, 'cb0df52fcaa602244ddca84fd20b317c')},
 'model A1 (448 wide), 1 MiB aio blocks': {'grads': (5, '22677ca6a5347859d22c88eaf8820cfb'),
                                           'master': (1, 'c7540fe5a33c368f0dc6dc86ed6e6fb5'),
                                           'optimizer': (2, '32ae9e348ed26db763c658d7b8f17755'),
                                           'params': (2, '7e482c34baf2c58db68bac18684a674a')},
 'model A2 (256 wide), 1 MiB aio blocks': {'grads': (5, '21266c7bd449ff9d93e293bba990e478'),
                                           'master': (1, 'eafdaa4757c1d64de0a681c42e42fb52'),
                                           'optimizer': (2, '472c6307c594bba19fcc5a920a58cdd5'),
                                           'params': (2, '8975ae3356215c2e8f3ba4bd61e6f26d')},
 'model B0 (416 wide), 2 MiB aio blocks': {'grads': (2, 'f1ef1965a6726015ce0a561909f62d0d'),
                                           'master': (1, '7961117299a4069f24730999081b0dae'),
                                           'optimizer': (2, 'bc1afaaa724a052eb97ac36e0cc10269')},
 'model B1 (320 wide), 2 MiB aio blocks': {'grads': (2, '5d49216872422ad34a0cebbd64046464'),
                                           'master': (1, '890a9650b3121955fd07bec7ae8fc648'),
                                           'optimizer': (2, '6b7b9ef741ce6ebd898a592b8215afe1')},
 'model B2 (288 wide), 2 MiB aio blocks': {'grads': (2, '493d0fadc9756d7c823f0fa51f377b46'),
                                           'master': (1, '353756d28cd11cec0856bfe0301d14be'),
                                           'optimizer': (2, '033496a4104007fb07ccdeeefb787194')}}
