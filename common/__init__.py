"""Infrastructure shared by the algorithm files: environments, CLI, logging,
checkpoints, the chunked host loop, plots. No losses, targets or networks.

Importing this package sets one XLA:CPU flag, before any module here imports
gymnax (which starts the JAX backend on import): XLA:CPU's concurrency-optimised
scheduler deadlocks on some programs (seen with jaxlib 0.10.2: the vmapped
initialisation of two MinAtar CNN torsos for 2+ seeds hangs every time, all
threads idle); with the scheduler off it runs, at no measurable cost here. A
value the user sets in XLA_FLAGS wins.
"""

import os

_SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler"
if _SCHEDULER_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_SCHEDULER_FLAG}=false".strip()
