"""The course machinery, shared by every chapter: the quiz engine (``quiz``), lab grading and
generation (``grading``, ``labgen``), the claims ledger (``ledger``), drawing helpers
(``drawing``), the environment check (``envcheck``), the chapter map (``catalog``) and the
chapter registry's types (``registry``).

It may use the engine (``gpumem.memory``, ``gpumem.runs``); it never imports a chapter.
"""
