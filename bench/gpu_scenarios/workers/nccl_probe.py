"""Whether NCCL forms a group and all-reduces with every rank on ``cuda:LOCAL_RANK % devices``
(two ranks on one GPU when there is one): rank 0 prints ``nccl-probe: ok <sum>``."""

import os
import sys

import torch
import torch.distributed as dist


def main() -> int:
    local = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    value = torch.ones(1, device=device)
    dist.all_reduce(value)
    if dist.get_rank() == 0:
        print(f"nccl-probe: ok {value.item():.0f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
