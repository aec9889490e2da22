"""Warm-start trampoline: the process torch starts in place of a Python worker.

It asks the node's warm template (``launcher.zygote``), which has already imported torch, to
fork the real worker with this process's arguments, environment, working directory and
standard streams (passed as file descriptors, so ``--log-dir``, ``-r`` and ``-t`` behave as in
torchrun). It then stands in for the worker: signals it receives are forwarded to the worker's
process group, and it exits with the worker's exit status (re-raising the same signal when the
worker was killed by one). If the template cannot be reached it ``exec``\\ s the original Python
command instead: the plain cold start, same pid, same streams.

Run as a file with ``python -I -S trampoline.py ARGS...`` (about 20 ms to start): it imports
only the standard library, so the small framing of :mod:`ft_core.protocol` (4-byte big-endian
length + JSON object) is repeated here rather than imported.
"""

import json
import os
import signal
import socket
import struct
import sys

ZYGOTE_SOCKET_ENV = "FT_WARM_TEMPLATE_SOCKET"
CONNECT_TIMEOUT = 2.0
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_HEADER = struct.Struct("!I")
_MAX_REPLY = 64 * 1024


def _cold_start(python_args: list) -> None:
    os.environ.pop(ZYGOTE_SOCKET_ENV, None)
    os.execv(sys.executable, [sys.executable, *python_args])


def _read_message(sock: socket.socket, buffer: bytearray) -> dict:
    while True:
        if len(buffer) >= _HEADER.size:
            (length,) = _HEADER.unpack_from(buffer)
            if length > _MAX_REPLY:
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


def main(python_args: list) -> None:
    path = os.environ.get(ZYGOTE_SOCKET_ENV)
    if not path:
        _cold_start(python_args)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT)
    try:
        sock.connect(path)
        env = {k: v for k, v in os.environ.items() if k != ZYGOTE_SOCKET_ENV}
        request = json.dumps({"type": "spawn", "argv": python_args, "env": env, "cwd": os.getcwd()}).encode()
        socket.send_fds(sock, [_HEADER.pack(len(request)) + request], [0, 1, 2])
        buffer = bytearray()
        reply = _read_message(sock, buffer)
    except (OSError, ValueError, ConnectionError):
        sock.close()
        _cold_start(python_args)
        return
    if reply.get("type") != "spawned":
        sock.close()
        _cold_start(python_args)
        return
    worker = int(reply["pid"])

    def forward(signum: int, _frame: object) -> None:
        try:
            os.killpg(worker, signum)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    sock.settimeout(None)
    try:
        while True:
            try:
                message = _read_message(sock, buffer)
            except InterruptedError:
                continue
            if message.get("type") == "exited":
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
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        # Die of the worker's signal, but without a core dump of our own: the worker wrote its
        # core already (where enabled), and ours would overwrite it (same name, same directory).
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
        except (ImportError, OSError, ValueError):
            pass
        os.kill(os.getpid(), -status)
        signal.pause()
    os._exit(status)


if __name__ == "__main__":
    main(sys.argv[1:])
