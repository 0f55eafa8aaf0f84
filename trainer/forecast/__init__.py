"""Launch-time prediction for ``drmas-bench train --plan``: the GPU memory of each worker group
(``memory``), the hours of a run (``hours``) and the GPUs they assume (``hardware``). The training
loop never runs this code; its own section of the recipe is ``config.forecast``."""
