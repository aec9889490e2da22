"""Another user (nobody) posing as one of our servers: run as root, it drops to uid/gid 65534 first.

Standard library only (it runs as ``python -I tests/stranger.py``), so that nothing of ours helps
the stranger. Two commands; each prints one JSON object per line on stdout, flushed:

``serve PATHS_JSON REPLY_HEX SLOT SECONDS``
    Listen at each path (the directory must let nobody create files) and, for each connection,
    record what arrives: ``{"got": path, "bytes": n, "fds": k, "text": first 20000 chars}``
    (``bytes`` 0: the client hung up without sending anything). With a non-empty ``REPLY_HEX``
    it then sends those bytes, together with a fresh progress slot (a memfd with the slot's
    magic and no sections) when ``SLOT`` is 1: a fake rank monitor that watches nothing. Prints
    ``{"listening": [...]}`` once bound; exits after ``SECONDS``.

``steal TMPDIR RUN_DIR NAMES_JSON SECONDS``
    The impersonation of issue 13 item 11: rename ``RUN_DIR`` (a launcher's run directory) out
    of the way within its parent, create a directory of the same name, open to all, and
    ``serve`` a socket for each of ``NAMES`` in it. Also renames every other ``ft-*`` entry of
    ``TMPDIR``. Prints ``{"renamed": path}`` or ``{"rename_failed": path, "error": ...}`` for
    each attempt, then serves as above.
"""

import json
import os
import select
import socket
import struct
import sys
import time

SLOT_MAGIC = 0x46545331  # ft_core.wire.progress_slot.MAGIC


def say(**fields) -> None:
    print(json.dumps(fields), flush=True)


def slot_fd() -> int:
    fd = os.memfd_create("fake-slot")
    os.ftruncate(fd, 4096)
    os.pwrite(fd, struct.pack("=II", SLOT_MAGIC, 0), 0)
    return fd


def serve(paths: list, reply: bytes, with_slot: bool, seconds: float) -> None:
    listeners = {}
    for path in paths:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        os.chmod(path, 0o777)
        listener.listen(16)
        listeners[listener] = path
    say(listening=paths)
    held = []
    deadline = time.monotonic() + seconds
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        ready, _, _ = select.select(list(listeners), [], [], remaining)
        for listener in ready:
            conn, _addr = listener.accept()
            conn.settimeout(2.0)
            try:
                data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 22, 8)
            except OSError:
                data, fds = b"", []
            for fd in fds:
                os.close(fd)
            say(got=listeners[listener], bytes=len(data), fds=len(fds), text=data[:20000].decode("latin-1"))
            if data and reply:
                try:
                    if with_slot:
                        fd = slot_fd()
                        socket.send_fds(conn, [reply], [fd])
                        os.close(fd)
                    else:
                        conn.sendall(reply)
                except OSError:
                    pass
                held.append(conn)  # a fake monitor keeps its rank connected
            else:
                conn.close()
    say(done=True)


def steal(tmpdir: str, run_dir: str, names: list, seconds: float) -> None:
    targets = [run_dir] + [os.path.join(tmpdir, n) for n in sorted(os.listdir(tmpdir)) if n.startswith("ft-")]
    paths = []
    for target in dict.fromkeys(targets):
        try:
            os.rename(target, target + ".stolen")
        except OSError as err:
            say(rename_failed=target, error=err.strerror)
            continue
        say(renamed=target)
        os.mkdir(target)
        os.chmod(target, 0o777)
        paths += [os.path.join(target, name) for name in names]
    serve(paths, b"", False, seconds)


def main() -> None:
    os.setgid(65534)
    os.setgroups([])
    os.setuid(65534)
    command, args = sys.argv[1], sys.argv[2:]
    if command == "serve":
        serve(json.loads(args[0]), bytes.fromhex(args[1]), args[2] == "1", float(args[3]))
    elif command == "steal":
        steal(args[0], args[1], json.loads(args[2]), float(args[3]))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main()
