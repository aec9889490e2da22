"""Two ranks observe different intervals; calculated timeouts must agree (all-reduce MAX).

Rank 0 waits 0.05 s between heartbeats and in ``step``, and alone opens ``only0`` (0.2 s).
Rank 1 waits 0.3 s and never opens ``only0``. No rank opens ``idle``.
"""

import json
import os
import sys
import time

import torch.distributed as dist

from ft_core import RankMonitorClient
from ft_core.wire.atomic import atomic_write_text

rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
client = RankMonitorClient()
client.init_workload_monitoring()
gap = 0.05 if rank == 0 else 0.3
for _ in range(3):
    client.send_heartbeat()
    time.sleep(gap)
client.send_heartbeat()
client.start_section("step")
time.sleep(gap)
client.end_section("step")
if rank == 0:
    client.start_section("only0")
    time.sleep(0.2)
    client.end_section("only0")
dist.barrier()
ok_hb = client.calculate_and_set_hb_timeouts()
ok_sections = client.calculate_and_set_section_timeouts(selected_sections=["step", "only0"], calc_out_of_section=False)
ok_idle = client.calculate_and_set_section_timeouts(selected_sections=["idle"], calc_out_of_section=False,
                                                    skip_if_not_ready=True)
atomic_write_text(os.path.join(sys.argv[1], f"rank{rank}.json"),
                  json.dumps({"ok": [ok_hb, ok_sections, ok_idle], "state": client.state_dict()}))
client.shutdown_workload_monitoring()
dist.destroy_process_group()
