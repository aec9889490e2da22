"""The warm template: a per-node process that imported torch once and forks workers on request.

Most of a restart is a new worker's interpreter start and ``import torch`` (seconds on a CPU
machine, tens of seconds on a GPU cluster). The launcher starts this template at launch; it
imports the heavy modules (never initialising CUDA or a process group), listens on a Unix socket
in the launcher's private run directory, and for each request from a :mod:`launcher.trampoline`
forks a worker that looks like a freshly started ``python [-u] script.py ARGS`` (or ``-m mod``):

- its own session and process group (like torchrun's workers), SIGKILLed if the template dies;
- the trampoline's environment, working directory, argv, and stdin/stdout/stderr (passed over
  the socket), so per-rank variables and torchrun's log redirection are exactly as without us;
- ``sys.path`` as Python would set it for that script, default signal handlers, reseeded
  ``random``;
- anything the template cannot reproduce in-process (interpreter options other than ``-u`` and
  ``-m``, a different ``PYTHONPATH``) makes the child ``exec`` the real interpreter instead.

The template reaps its workers and reports each exit status to the waiting trampoline. If a
trampoline goes away first (torch SIGKILLed it), the template kills that worker's group.

Run: ``python launcher/zygote.py --socket PATH --parent-pid PID [--preload mod,mod] [--ready-fd N]``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import importlib
import io
import json
import os
import random
import runpy
import selectors
import signal
import socket
import struct
import sys
import threading
import traceback

_HEADER = struct.Struct("!I")
MAX_REQUEST_BYTES = 4 * 1024 * 1024  # an environment can be large (SLURM sets many variables)
_PR_SET_PDEATHSIG = 1
DEFAULT_PRELOAD = ("torch", "torch.distributed")
PRELOAD_NICENESS = 19


def _prctl_pdeathsig(sig: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)


def _encode(message: dict) -> bytes:
    payload = json.dumps(message, separators=(",", ":")).encode()
    return _HEADER.pack(len(payload)) + payload


class _Pending:
    """A trampoline connection: its request is read, then it waits for its worker's exit."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.fds: list[int] = []
        self.worker: int | None = None


class Zygote:
    """Serves spawn requests; see the module docstring."""

    def __init__(self, socket_path: str, parent_pid: int, preload: list[str]) -> None:
        self.socket_path = socket_path
        self.parent_pid = parent_pid
        self.preload = preload
        self.selector = selectors.DefaultSelector()
        self.connections: dict[int, _Pending] = {}
        self.workers: dict[int, _Pending] = {}
        self.stopping = False
        self.startup_sys_path = list(sys.path)
        self.startup_pythonpath = os.environ.get("PYTHONPATH", "")

    def preload_modules(self) -> list[str]:
        failed: list[str] = []

        def import_all() -> None:
            # The template imports while the cycle's workers start and train: at the lowest
            # priority it takes only idle CPU. Niceness is per thread on Linux, so the main
            # thread, which forks the workers, keeps the launcher's.
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), PRELOAD_NICENESS)
            for name in self.preload:
                try:
                    importlib.import_module(name)
                except Exception as err:  # a broken optional preload must not stop warm starts
                    failed.append(f"{name}: {type(err).__name__}: {err}")

        importer = threading.Thread(target=import_all, name="ft-warm-preload")
        importer.start()
        importer.join()
        return failed

    def listen(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            self.listener.bind(self.socket_path)
        finally:
            os.umask(old_umask)
        self.listener.listen(64)
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        signal.set_wakeup_fd(self.wake_w.fileno(), warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_stop)
        _prctl_pdeathsig(signal.SIGHUP)
        if os.getppid() != self.parent_pid:
            self.stopping = True

    def _on_stop(self, *_: object) -> None:
        self.stopping = True

    def serve(self) -> None:
        while not self.stopping:
            for key, _ in self.selector.select(5.0):
                if key.data is None:
                    self._accept()
                elif key.data == "wake":
                    with contextlib.suppress(BlockingIOError, InterruptedError):
                        while self.wake_r.recv(512):
                            pass
                else:
                    self._read(key.data)
            self._reap()
            if os.getppid() != self.parent_pid:
                self.stopping = True
        for pid in list(self.workers):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        import time

        self._reap(deadline=time.monotonic() + 5.0)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            peer_pid, uid, _gid = struct.unpack("3i", creds)
            if uid != os.getuid() or _parent_of(peer_pid) != self.parent_pid:
                sock.close()  # only the launcher's own children (trampolines) may ask
                continue
            sock.setblocking(False)
            pending = _Pending(sock)
            self.connections[sock.fileno()] = pending
            self.selector.register(sock, selectors.EVENT_READ, pending)

    def _read(self, pending: _Pending) -> None:
        try:
            data, fds, _flags, _addr = socket.recv_fds(pending.sock, 65536, 3)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, fds = b"", []
        if pending.worker is not None:
            for fd in fds:  # nothing more is expected from a trampoline once its worker runs
                os.close(fd)
            if not data:
                self._drop(pending)
            return
        pending.fds.extend(fds)
        if not data:
            self._drop(pending)
            return
        pending.buffer += data
        if len(pending.buffer) < _HEADER.size:
            return
        (length,) = _HEADER.unpack_from(pending.buffer)
        if length > MAX_REQUEST_BYTES or len(pending.fds) > 3:
            self._drop(pending)
            return
        if len(pending.buffer) < _HEADER.size + length:
            return
        try:
            request = json.loads(bytes(pending.buffer[_HEADER.size : _HEADER.size + length]))
            argv, env, cwd = request["argv"], request["env"], request["cwd"]
            if not (isinstance(argv, list) and isinstance(env, dict) and isinstance(cwd, str)):
                raise ValueError("bad request")
        except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: deeply nested JSON
            self._drop(pending)
            return
        if len(pending.fds) != 3:
            self._drop(pending)
            return
        self._spawn(pending, [str(a) for a in argv], {str(k): str(v) for k, v in env.items()}, cwd)

    def _spawn(self, pending: _Pending, argv: list[str], env: dict[str, str], cwd: str) -> None:
        pid = os.fork()
        if pid == 0:
            try:
                self._become_worker(pending, argv, env, cwd)
            finally:
                os._exit(70)
        for fd in pending.fds:
            os.close(fd)
        pending.fds = []
        pending.worker = pid
        self.workers[pid] = pending
        with contextlib.suppress(OSError):
            pending.sock.setblocking(True)
            pending.sock.sendall(_encode({"type": "spawned", "pid": pid}))
            pending.sock.setblocking(False)

    def _drop(self, pending: _Pending) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(pending.sock)
        self.connections.pop(pending.sock.fileno(), None)
        pending.sock.close()
        for fd in pending.fds:
            os.close(fd)
        pending.fds = []
        if pending.worker is not None and pending.worker in self.workers:
            # The trampoline is gone (torch escalated to SIGKILL): its worker must not outlive it.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pending.worker, signal.SIGKILL)

    def _reap(self, deadline: float | None = None) -> None:
        """Collect exited workers and report them; with a deadline, wait for all (bounded)."""
        import time

        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                if deadline is None or time.monotonic() > deadline:
                    return
                time.sleep(0.01)
                continue
            pending = self.workers.pop(pid, None)
            if pending is None:
                continue
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            with contextlib.suppress(OSError):
                pending.sock.setblocking(True)
                pending.sock.sendall(_encode({"type": "exited", "pid": pid, "status": code}))
            pending.worker = None
            self._drop(pending)

    # ------------------------------------------------------------------ in the child

    def _become_worker(self, pending: _Pending, argv: list[str], env: dict[str, str], cwd: str) -> None:
        os.setsid()
        _prctl_pdeathsig(signal.SIGKILL)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in range(3):
            os.dup2(pending.fds[fd], fd)
        for fd in pending.fds:
            if fd > 2:
                os.close(fd)
        for sock in [self.listener, self.wake_r, self.wake_w] + [p.sock for p in self.connections.values()]:
            sock.close()
        self.selector.close()
        os.chdir(cwd)  # before a cold start too: the worker runs where its trampoline was started
        unbuffered, target, is_module = _parse_python_args(argv)
        if target is None or env.get("PYTHONPATH", "") != self.startup_pythonpath:
            os.execve(sys.executable, [sys.executable, *argv], env)  # cannot emulate: cold start
        os.environ.clear()
        os.environ.update(env)
        _reopen_stdio(unbuffered)
        random.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        script_args = argv[argv.index(target) + 1 :]
        zygote_entries = {self.startup_sys_path[0]} if self.startup_sys_path else set()
        sys.path[:] = [p for p in sys.path if p not in zygote_entries]
        code = 0
        try:
            if is_module:
                sys.argv = [target, *script_args]
                sys.path.insert(0, os.getcwd())
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                sys.argv = [target, *script_args]
                sys.path.insert(0, os.path.dirname(os.path.realpath(target)))
                runpy.run_path(target, run_name="__main__")
        except SystemExit as exc:
            code = _exit_code(exc)
        except BaseException:
            traceback.print_exc()
            code = 1
        try:
            atexit._run_exitfuncs()
        except BaseException:
            traceback.print_exc()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _parse_python_args(argv: list[str]) -> tuple[bool, str | None, bool]:
    """``(unbuffered, script or module, is_module)``; target None if not reproducible."""
    unbuffered = False
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "-u":
            unbuffered = True
        elif arg == "-m" and index + 1 < len(argv):
            return unbuffered, argv[index + 1], True
        elif arg.startswith("-"):
            return unbuffered, None, False
        else:
            return unbuffered, arg, False
        index += 1
    return unbuffered, None, False


def _reopen_stdio(unbuffered: bool) -> None:
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding=sys.stdin.encoding)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        raw = io.FileIO(fd, "w", closefd=False)
        buffered = io.BufferedWriter(raw)
        stream = io.TextIOWrapper(buffered, encoding=getattr(sys, name).encoding, errors="backslashreplace",
                                  line_buffering=True, write_through=unbuffered or fd == 2)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stream:
            raw = stream.read()
    except OSError:
        return None
    return int(raw[raw.rfind(b")") + 2 :].split()[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="ft_launcher's warm template (internal)")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--preload", default=",".join(DEFAULT_PRELOAD))
    parser.add_argument("--ready-fd", type=int)
    args = parser.parse_args(argv)
    zygote = Zygote(args.socket, args.parent_pid, [m for m in args.preload.split(",") if m])
    failed = zygote.preload_modules()
    zygote.listen()
    cuda_initialized = "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized()
    if args.ready_fd is not None:
        os.write(args.ready_fd, (json.dumps({"ready": True, "failed_preloads": failed,
                                             "cuda_initialized": cuda_initialized}) + "\n").encode())
        os.close(args.ready_fd)
    zygote.serve()
    return 0


if __name__ == "__main__":
    code = main()
    # Tearing down an interpreter that imported lightning and torch takes over a second here,
    # and the launcher waits for the template at exit: the template holds nothing to flush.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
