"""One rank of a gloo group that plans a simulated fault and prints the plan as JSON.

``python lightning_fault_plan.py '<params json>'`` with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set. Each rank draws from a differently seeded generator, so equal plans on all
ranks can only come from the broadcast in ``plan_simulated_fault``.
"""

import dataclasses
import json
import os
import random
import sys

import torch.distributed as dist

from ft_core.client.simulated_fault import plan_simulated_fault


def main() -> int:
    dist.init_process_group("gloo")
    try:
        rank = dist.get_rank()
        plan = plan_simulated_fault(json.loads(sys.argv[1]), rng=random.Random(1000 + 17 * rank))
        print(json.dumps({"rank": rank, "pid": os.getpid(), **dataclasses.asdict(plan)}), flush=True)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
