"""One process of a two-process GRPO run under jax.distributed, 2 host devices each (run by
tests/test_parallel_multiprocess.py):

    python tests/multidevice/grpo_process.py PROCESS_ID PORT WORKDIR

The run is `tests.micro_grpo`'s with its MULTI_PROCESS settings: a data=2 (over the processes) x fsdp=2 (within
each) mesh, 3 steps, a checkpoint every step. Prints the trainer's start-up line and `finished step N`.
"""

import os
import sys

from tests.xla_flags import suite_xla_flags

os.environ["XLA_FLAGS"] = suite_xla_flags(os.environ.get("XLA_FLAGS", ""), 2)


import jaxpt  # noqa: E402
from jaxpt.trainers.grpo import replace_hooks  # noqa: E402
from jaxpt import parallel  # noqa: E402

def main(process_id: int, port: int, workdir: str) -> None:
  parallel.initialize("on", f"localhost:{port}", num_processes=2, process_id=process_id)
  from tests.micro_grpo import MULTI_PROCESS, even_length, micro_config

  trainer = replace_hooks(jaxpt.build("grpo", micro_config(**MULTI_PROCESS), workdir), reward_fn=even_length)
  print(trainer.describe(), flush=True)
  result = jaxpt.train("grpo", trainer.config, workdir, built=trainer)
  print(f"finished step {int(result.state.step)}", flush=True)


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
