"""How long a just-in-time save of a ~200 MB state (model + Adam) takes on this machine.

Both paths of ft_core/client/jit_state.py, through the real code (capture, torch.save, checksum,
manifest), into a fresh state directory each time:

* blocked: the main thread is blocked with the GIL released (as in a collective behind a hung
  peer); the state thread saves, as the monitor's ``save_state`` asks it to;
* exception: the main thread saves (as the excepthook of a rank whose collective failed).

    PYTHONPATH=$PWD .venv/bin/python bench/jit_state_save.py [--mb 200] [--repeats 3] [--dir /tmp]

Prints one line per run and the median of each path (the issue's goal: under 1 s): wall time, and
the saving thread's CPU time, which is what the wall time is on an idle machine (on a loaded one
the wall time shows the contention; the load average is printed along).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import threading
import time

import torch

from ft_core.client.jit_state import JitState
from ft_core.client.plain_state import PlainStateProvider


def build(total_mb: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A model whose parameters plus Adam's two moments are about ``total_mb`` MB, after one step."""
    width = 2048
    layers = max(1, round(total_mb * 1e6 / 3 / 4 / (width * width + width)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    return model, optimizer


def save_once(provider: PlainStateProvider, base: str, blocked: bool) -> tuple[float, float, int]:
    directory = tempfile.mkdtemp(prefix="jit-bench-", dir=base)
    try:
        jit = JitState(state_dir=directory, monitor_socket="")
        jit._provider = provider  # attach() would also chain the excepthook; not wanted in a bench
        if not blocked:
            started, cpu = time.perf_counter(), time.thread_time()
            result = jit.save_now("exception")
            return time.perf_counter() - started, time.thread_time() - cpu, result.bytes
        out: dict[str, object] = {}
        release = threading.Event()

        def state_thread() -> None:
            started, cpu = time.perf_counter(), time.thread_time()
            out["result"] = jit.save_now("blocked")
            out["seconds"] = time.perf_counter() - started
            out["cpu"] = time.thread_time() - cpu
            release.set()

        threading.Thread(target=state_thread).start()
        release.wait()  # the main thread blocked, GIL released, as in a collective
        return out["seconds"], out["cpu"], out["result"].bytes  # type: ignore[attr-defined,return-value]
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=200.0, help="state size in MB (default 200)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", action="append", help="where the state directory goes (default /tmp and /dev/shm)")
    args = parser.parse_args()
    model, optimizer = build(args.mb)
    provider = PlainStateProvider(model, optimizer)
    print(f"state: {provider.approx_bytes() / 1e6:.0f} MB (parameters + Adam moments), torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    for base in args.dir or ["/tmp", "/dev/shm"]:
        for path in ("blocked", "exception"):
            times, cpus = [], []
            for _ in range(args.repeats):
                seconds, cpu, size = save_once(provider, base, path == "blocked")
                times.append(seconds)
                cpus.append(cpu)
                print(f"  {base:9s} {path:9s} {size / 1e6:7.1f} MB  {seconds:.3f} s wall, {cpu:.3f} s CPU")
            print(f"{base:9s} {path:9s} median {statistics.median(times):.3f} s wall (max {max(times):.3f} s), "
                  f"median {statistics.median(cpus):.3f} s CPU of the saving thread (load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
