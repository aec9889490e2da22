"""Warm-start trampoline: the process torch starts in place of a Python worker.

It asks the node's warm template (``launcher.warm.zygote``), which has already imported torch, to
fork the real worker with this process's arguments, environment, working directory and
standard streams (passed as file descriptors, so ``--log-dir``, ``-r`` and ``-t`` behave as in
torchrun). It then stands in for the worker and exits with the worker's exit status
(re-raising the same signal when the worker was killed by one). If the template cannot be reached
it ``exec``\\ s the original Python command instead: the plain cold start, same pid, same streams.

Signals: the trampoline blocks the signals of :data:`ft_core.wire.osutil.STEP_SIGNALS` as its first
act and takes them with ``sigwaitinfo``. It passes one on to the worker's process group only when
its parent (the launcher, or torch inside it) sent it; a signal from anyone else is dropped: under
SLURM the step daemon signals every process of the step, so the worker has its own copy already,
and a relay would make its handler run twice. Once the worker runs, the trampoline's command line
(``ps``, ``pgrep -f``) becomes ``ft_launcher stand-in for worker pid N``, so that looking for the
script finds the worker, which is the process to signal or to attach a debugger to.

Run as a file with ``python -I -S trampoline.py ARGS...``. It stays standard-library only, on
purpose: it runs once per worker start, and importing ``ft_core.wire.protocol`` (which imports the
``ft_core`` package) doubled its start time (20 starts on the 2-core dev machine: median 41 ms
for the standard-library imports alone, 82 ms with ``ft_core.wire.protocol``). So the protocol's
small framing (4-byte big-endian length + JSON object), its reply bound, the warm-template
message names and the socket variable's name are repeated here; ``tests/unit/test_warm_protocol.py``
checks that each copy equals ft_core's (and that the two ends understand each other). For the
same reason it has its own copy of the client's uid check (``ft_core.wire.protocol.connect_unix``):
the template must run as this user, checked with ``SO_PEERCRED`` before the request (which
carries the whole environment and the standard streams) is sent; another user's socket at the
path gets one line on stderr and a cold start. The step signals and the process-title code
(``ft_core.wire.osutil``) are repeated here for the same reason.
"""

import json
import os
import signal
import socket
import struct
import sys
import threading

# Copies of ft_core's names and limits (see the module docstring):
ZYGOTE_SOCKET_ENV = "FT_WARM_TEMPLATE_SOCKET"  # ft_core.wire.env.FT_WARM_TEMPLATE_SOCKET_ENV_VAR
MSG_SPAWN = "spawn"  # ft_core.wire.protocol.MSG_SPAWN
MSG_SPAWNED = "spawned"  # ft_core.wire.protocol.MSG_SPAWNED
MSG_EXITED = "exited"  # ft_core.wire.protocol.MSG_EXITED
MAX_REPLY_BYTES = 64 * 1024  # ft_core.wire.protocol.MAX_MESSAGE_BYTES
MAX_REQUEST_BYTES = 4 * 1024 * 1024  # launcher.warm.zygote.MAX_REQUEST_BYTES
_HEADER = struct.Struct("!I")  # ft_core.wire.protocol's frame header
_PEERCRED = struct.Struct("3i")  # ft_core.wire.protocol's SO_PEERCRED layout: pid, uid, gid

STEP_SIGNALS = (  # ft_core.wire.osutil.STEP_SIGNALS
    signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM,
    signal.SIGTERM, signal.SIGXCPU, signal.SIGXFSZ, signal.SIGVTALRM, signal.SIGPROF, signal.SIGPOLL,
    signal.SIGPWR,
)

CONNECT_TIMEOUT = 2.0


def _cold_start(python_args: list, mask: set) -> None:
    os.environ.pop(ZYGOTE_SOCKET_ENV, None)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # exec keeps a blocked mask: the worker's own
    os.execv(sys.executable, [sys.executable, *python_args])


def _set_title(title: str) -> None:
    """ft_core.wire.osutil.set_process_title (see there), best effort."""
    try:
        import ctypes

        with open("/proc/self/stat", "rb") as stream:
            raw = stream.read()
        fields = raw[raw.rfind(b")") + 2 :].split()
        start, end = int(fields[45]), int(fields[46])
        with open("/proc/self/cmdline", "rb") as stream:
            shown = stream.read()
        size = end - start
        check = min(size, len(shown), 64)
        if size < 2 or start <= 0 or ctypes.string_at(start, check) != shown[:check]:
            return
        data = title.encode(errors="replace")[: size - 2] + b"\0"
        ctypes.memmove(start, data + b" " * (size - len(data)), size)
    except (ImportError, OSError, ValueError, IndexError):
        pass


def _relay_from_parent(worker: int, parent: int) -> None:
    """Pass on the step signals the launcher sends us; drop everyone else's (see the docstring)."""
    while True:
        info = signal.sigwaitinfo(STEP_SIGNALS)
        if info.si_pid == parent:
            try:
                os.killpg(worker, info.si_signo)
            except ProcessLookupError:
                pass


def _read_message(sock: socket.socket, buffer: bytearray) -> dict:
    while True:
        if len(buffer) >= _HEADER.size:
            (length,) = _HEADER.unpack_from(buffer)
            if length > MAX_REPLY_BYTES:
                raise ConnectionError("oversized reply from the warm template")
            if len(buffer) >= _HEADER.size + length:
                payload = bytes(buffer[_HEADER.size : _HEADER.size + length])
                del buffer[: _HEADER.size + length]
                message = json.loads(payload)
                if not isinstance(message, dict):
                    raise ConnectionError("malformed reply from the warm template")
                return message
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the warm template closed the connection")
        buffer += chunk


def _check_template_uid(sock: socket.socket, path: str) -> None:
    """Refuse a template of another user (see the module docstring); raises ConnectionError."""
    pid, uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    if uid != os.getuid():
        sys.stderr.write(
            f"ft_launcher trampoline: the warm template socket {path} is served by pid {pid} of uid "
            f"{uid}, not by this user (uid {os.getuid()}); refusing to send it anything, starting "
            "the worker cold\n"
        )
        sys.stderr.flush()
        raise ConnectionError("warm template socket served by another user")


def main(python_args: list) -> None:
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STEP_SIGNALS)
    parent = os.getppid()
    path = os.environ.get(ZYGOTE_SOCKET_ENV)
    if not path:
        _cold_start(python_args, mask)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT)
    try:
        sock.connect(path)
        _check_template_uid(sock, path)
        env = {k: v for k, v in os.environ.items() if k != ZYGOTE_SOCKET_ENV}
        request = json.dumps({"type": MSG_SPAWN, "argv": python_args, "env": env, "cwd": os.getcwd()}).encode()
        if len(request) > MAX_REQUEST_BYTES:
            raise ValueError("request too large for the warm template")
        socket.send_fds(sock, [_HEADER.pack(len(request)) + request], [0, 1, 2])
        buffer = bytearray()
        reply = _read_message(sock, buffer)
    except (OSError, ValueError, ConnectionError):
        sock.close()
        _cold_start(python_args, mask)
        return
    if reply.get("type") != MSG_SPAWNED:
        sock.close()
        _cold_start(python_args, mask)
        return
    worker = int(reply["pid"])
    _set_title(f"ft_launcher stand-in for worker pid {worker}")
    threading.Thread(target=_relay_from_parent, args=(worker, parent), daemon=True).start()
    sock.settimeout(None)
    try:
        while True:
            message = _read_message(sock, buffer)
            if message.get("type") == MSG_EXITED:
                status = int(message["status"])
                break
    except (OSError, ValueError, ConnectionError):
        # The template died with our worker unaccounted for: make sure it is gone too.
        try:
            os.killpg(worker, signal.SIGKILL)
        except ProcessLookupError:
            pass
        status = 1
    sys.stdout.flush()
    if status < 0:
        try:
            signal.signal(-status, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {-status})
        except (OSError, ValueError):  # SIGKILL, SIGSTOP: nothing to reset
            pass
        # Die of the worker's signal, but without a core dump of our own: the worker wrote its
        # core already (where enabled), and ours would overwrite it (same name, same directory).
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
        except (ImportError, OSError, ValueError):
            pass
        # To this thread: the relay thread waits in sigwaitinfo and could take a process-wide one.
        signal.pthread_kill(threading.get_ident(), -status)
        signal.pause()
    os._exit(status)


if __name__ == "__main__":
    main(sys.argv[1:])
