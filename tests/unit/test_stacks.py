"""Stack capture (ft_core.wire.stacks) on real processes, and how dumps are read.

py-spy and the client's faulthandler fallback each read a real Python process that is sleeping,
stopped (SIGSTOP) or busy in a C call holding the GIL. The non-root path runs the rank and the
capture as ``nobody``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from ft_core.wire import stacks
from ft_core.wire.config import ConfigError, FaultToleranceConfig
from ft_core.wire.progress_slot import ProgressSlot

# A process that registers the client's dump handler (as init does), prints the memfd number,
# then blocks as told inside a function whose name the stack must show.
TARGET = textwrap.dedent("""
    import ctypes, os, signal, sys, time
    from ft_core.wire.stacks import DumpHandler
    handler = DumpHandler.install()
    def blocked_sleeping():
        time.sleep(60)
    def blocked_in_c_holding_the_gil():
        ctypes.PyDLL(None).sleep(60)
    def blocked_stopped():
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(60)
    print(handler.fd, handler.signum, flush=True)
    {"sleep": blocked_sleeping, "gil": blocked_in_c_holding_the_gil, "stop": blocked_stopped}[sys.argv[1]]()
""")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Target:
    def __init__(self, mode: str, preexec=None) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", TARGET, mode], stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": ROOT}, preexec_fn=preexec)
        fd, signum = self.proc.stdout.readline().split()
        self.mode = mode
        # The monitor receives the memfd over the socket; a test may open it through /proc.
        self.dump_fd = os.open(f"/proc/{self.proc.pid}/fd/{fd}", os.O_RDONLY)
        self.target = stacks.StackTarget(pid=self.proc.pid, dump_fd=self.dump_fd, dump_signal=int(signum))

    def wait_blocked(self) -> None:
        want = "T" if self.mode == "stop" else None
        for _ in range(500):
            with open(f"/proc/{self.proc.pid}/stat") as stream:
                state = stream.read().rpartition(")")[2].split()[0]
            if want is None or state == want:
                break
            threading.Event().wait(0.01)
        threading.Event().wait(0.3)  # past the print: inside the blocking call

    def close(self) -> None:
        os.close(self.dump_fd)
        self.proc.kill()
        self.proc.wait(10)
        self.proc.stdout.close()


@pytest.fixture
def target(request):
    made = []

    def factory(mode, preexec=None):
        made.append(Target(mode, preexec))
        made[-1].wait_blocked()
        return made[-1]

    yield factory
    for t in made:
        t.close()


@pytest.mark.parametrize("mode", ["sleep", "gil", "stop"])
@pytest.mark.parametrize("method", ["py-spy", "faulthandler"])
def test_capture_shows_where_the_main_thread_is(target, monkeypatch, method, mode):
    if method == "faulthandler":
        monkeypatch.setenv("FT_PY_SPY", "off")
    elif stacks.find_py_spy() is None:
        pytest.skip("py-spy is not installed (pip install 'ptl-resiliency[stacks]')")
    t = target(mode)
    result = stacks.capture(t.target, budget=5.0, stopped=mode == "stop")
    assert result.method == method and result.error is None, result
    assert result.frames[0].endswith({"sleep": " blocked_sleeping", "gil": " blocked_in_c_holding_the_gil",
                                      "stop": " blocked_stopped"}[mode]), result.frames
    assert result.frames[-1].endswith(" <module>")
    assert result.seconds < 5.0


def test_a_rank_without_a_handler_and_without_py_spy_has_no_stack(monkeypatch):
    monkeypatch.setenv("FT_PY_SPY", "off")
    result = stacks.capture(stacks.StackTarget(pid=os.getpid()), budget=1.0)
    assert result.method is None and result.frames == []
    assert result.error == "py-spy is not installed; the rank registered no faulthandler signal"
    assert stacks.capture(stacks.StackTarget(pid=os.getpid()), budget=0).error.startswith("stack capture is off")


def test_a_failing_py_spy_falls_back_to_faulthandler(target, monkeypatch, tmp_path):
    # As under Yama ptrace_scope 1 without PR_SET_PTRACER: py-spy is refused.
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\necho 'Error: Permission denied (os error 13)' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("FT_PY_SPY", str(fake))
    t = target("sleep")
    result = stacks.capture(t.target, budget=5.0)
    assert result.method == "faulthandler" and result.frames[0].endswith(" blocked_sleeping")
    assert "Permission denied" in result.note


SYSTEM_PYTHON = "/usr/bin/python3"  # readable by nobody (a python under /root may not be)


def _world_readable_copy_of_ft_core() -> str:
    """A fresh 0755 directory under /tmp holding a copy of the ``ft_core`` package."""
    import tempfile

    where = tempfile.mkdtemp(prefix="ptlr-nobody-", dir="/tmp")
    shutil.copytree(os.path.join(ROOT, "ft_core"), os.path.join(where, "ft_core"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    for folder, _dirs, files in os.walk(where):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)
    return where


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run the rank and the capture as nobody")
@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason="no system python for nobody")
def test_the_non_root_path_as_nobody(tmp_path):
    """Rank and capture as ``nobody``: no root privilege, no CAP_SYS_PTRACE; the rank allows its
    tracer with PR_SET_PTRACER, as the client does for its monitor."""
    if stacks.find_py_spy() is None:
        pytest.skip("py-spy is not installed")
    # nobody may not reach the checkout or the venv (a clone under a 0700 directory, pytest's own
    # 0700 tmp root): the code and py-spy it runs are copied into a world-readable directory.
    readable = _world_readable_copy_of_ft_core()
    py_spy = os.path.join(readable, "py-spy")
    shutil.copy2(stacks.find_py_spy(), py_spy)
    code = textwrap.dedent(f"""
        import json, os, subprocess, sys, time
        os.setgid(65534); os.setuid(65534)
        from ft_core.wire import stacks
        from ft_core.wire.osutil import allow_tracer
        rank = subprocess.Popen([sys.executable, "-c",
            "import os, sys, time\\n"
            "from ft_core.wire.osutil import allow_tracer\\n"
            "allow_tracer(os.getppid())\\n"
            "def waiting_as_nobody():\\n"
            "    print('ready', flush=True); time.sleep(60)\\n"
            "waiting_as_nobody()\\n"], stdout=subprocess.PIPE, text=True)
        rank.stdout.readline(); time.sleep(0.3)
        os.environ["FT_PY_SPY"] = {py_spy!r}
        result = stacks.capture(stacks.StackTarget(pid=rank.pid), budget=5.0)
        rank.kill(); rank.wait()
        print(json.dumps({{"uid": os.getuid(), "method": result.method, "frames": result.frames,
                          "error": result.error}}))
    """)
    try:
        out = subprocess.run([SYSTEM_PYTHON, "-c", code], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": readable}, cwd="/")
    finally:
        shutil.rmtree(readable)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["uid"] == 65534
    assert result["method"] == "py-spy" and result["frames"][0].endswith(" waiting_as_nobody"), result


def test_faulthandler_dumps_are_read_for_the_main_thread():
    text = (
        "Thread 0x00007f0000000002 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n'
        "\n"
        "Current thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/job/train.py", line 31 in freeze_here\n'
        '  File "/job/train.py", line 72 in main\n'
    )
    assert stacks._faulthandler_main_frames(text, 0x7F0000000001) == [
        "/job/train.py:31 freeze_here", "/job/train.py:72 main"]
    assert stacks._faulthandler_main_frames(text, None) == ["/usr/lib/python3.11/threading.py:320 wait"]
    assert stacks._faulthandler_main_frames("garbage", 1) == []


def test_py_spy_json_is_read_for_the_main_thread():
    threads = [
        {"os_thread_id": 8, "thread_name": "loader", "frames": [{"filename": "/x.py", "line": 3, "name": "run"}]},
        {"os_thread_id": 7, "thread_name": "MainThread", "owns_gil": True,
         "frames": [{"filename": "/job/t.py", "line": i, "name": f"f{i}"} for i in range(15)]},
        "not a thread",
    ]
    result = stacks._from_py_spy(threads, pid=7)
    assert result.frames == [f"/job/t.py:{i} f{i}" for i in range(stacks.MAX_FRAMES)]
    assert "holds the GIL, main thread" in result.text and "'loader'" in result.text


def test_the_innermost_user_frame_skips_libraries():
    lib = os.path.join(os.path.dirname(threading.__file__), "threading.py")
    site = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    core = os.path.join(os.path.dirname(stacks.__file__), "rank_monitor_client.py")
    frames = [f"{site}:3252 all_reduce", f"{lib}:320 wait", f"{core}:200 send_heartbeat", "<frozen runpy>:88 _run",
              "/job/train.py:69 main"]
    assert stacks.innermost_user_frame(frames) == "/job/train.py:69 main"
    assert stacks.innermost_user_frame(frames[:3]) is None


def test_find_py_spy_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("FT_PY_SPY", "off")
    assert stacks.find_py_spy() is None
    monkeypatch.setenv("FT_PY_SPY", "/opt/py-spy")
    assert stacks.find_py_spy() == "/opt/py-spy"
    monkeypatch.delenv("FT_PY_SPY")
    found = stacks.find_py_spy()
    assert found is None or os.access(found, os.X_OK)
    if shutil.which("py-spy") is None and not os.path.exists(os.path.join(os.path.dirname(sys.executable), "py-spy")):
        assert found is None


def test_write_stack_file(tmp_path):
    path, error = stacks.write_stack_file(str(tmp_path / "ft_stacks"), "r1.txt", "rank 1 hung",
                                          stacks.StackCapture(text="Thread 1:\n  frame\n", method="py-spy"))
    assert error is None and open(path).read() == "rank 1 hung\n\nThread 1:\n  frame\n"
    assert os.stat(path).st_mode & 0o777 == 0o600
    (tmp_path / "blocked").write_text("a file where a directory should be")
    path, error = stacks.write_stack_file(str(tmp_path / "blocked"), "r1.txt", "h", stacks.StackCapture())
    assert path is None and "cannot write" in error


def test_the_slot_carries_the_step():
    slot, fd = ProgressSlot.create(2)
    os.close(fd)
    try:
        assert slot.step() is None
        import struct

        from ft_core.wire.progress_slot import OFF_STEP
        struct.pack_into("=Q", slot.buffer, OFF_STEP, 62)
        assert slot.step() == 61
    finally:
        slot.close()


@pytest.mark.parametrize("value", ["SIGSTOP", "stop", 19, "SIGCONT", "CHLD", "SIGTSTP", "TTIN", "TTOU", "URG",
                                   "WINCH", signal.SIGSTOP])
def test_signals_that_cannot_end_a_process_are_refused(value):
    with pytest.raises(ConfigError, match="rank_termination_signal: SIG[A-Z]+ cannot end a hung rank"):
        FaultToleranceConfig(rank_termination_signal=value)


def test_termination_grace_and_capture_budget_are_bounded():
    cfg = FaultToleranceConfig(rank_termination_grace="2.5", stack_capture_budget="0")
    assert (cfg.rank_termination_grace, cfg.stack_capture_budget) == (2.5, 0.0)
    assert (FaultToleranceConfig().rank_termination_grace, FaultToleranceConfig().stack_capture_budget) == (5.0, 2.0)
    for field, bad in [("rank_termination_grace", 0), ("rank_termination_grace", None), ("rank_termination_grace", 1e9),
                       ("stack_capture_budget", -1), ("stack_capture_budget", 61), ("stack_capture_budget", "nan"),
                       ("stack_capture_budget", None), ("stack_capture_budget", True)]:
        with pytest.raises(ConfigError, match=field):
            FaultToleranceConfig(**{field: bad})
