"""Wire protocol between ranks, rank monitors and the launcher.

Every message is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON encoding
one object with a string ``"type"``. Messages larger than :data:`MAX_MESSAGE_BYTES` are refused
by both sides. JSON is the only decoder used on anything read from a socket: no pickle, no eval.

Sockets are Unix stream sockets inside a private (0700) directory; servers additionally check
the peer's uid with ``SO_PEERCRED``.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
import time
from collections.abc import Iterator
from typing import Any

from ft_core.errors import ProtocolError

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 64 * 1024
# sockaddr_un.sun_path is 108 bytes on Linux, including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107

_HEADER = struct.Struct("!I")
_PEERCRED = struct.Struct("3i")

# Message types. Rank (client) -> monitor:
MSG_INIT = "init"
MSG_SET_HB_TIMEOUTS = "set_hb_timeouts"
MSG_SET_SECTION_TIMEOUTS = "set_section_timeouts"
MSG_SHUTDOWN = "shutdown"
# Monitor -> rank:
MSG_INIT_OK = "init_ok"
MSG_OK = "ok"
MSG_ERROR = "error"
# Launcher -> monitor:
MSG_LAUNCHER_HELLO = "launcher_hello"
MSG_WORKER_STARTED = "worker_started"
MSG_LAUNCHER_BYE = "launcher_bye"
# Monitor -> launcher:
MSG_RANK_HANG = "rank_hang"
MSG_RANK_CONNECTED = "rank_connected"
MSG_RANK_DISCONNECTED = "rank_disconnected"
# Rank -> launcher control socket:
MSG_WORKLOAD_CONTROL = "workload_control"


def encode(message: dict[str, Any]) -> bytes:
    """Frame one message.

    Raises:
        ProtocolError: The message is not a dict with a string ``type``, is not
            JSON-serialisable, or is larger than :data:`MAX_MESSAGE_BYTES`.
    """
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError(f"a message must be a dict with a string 'type', got {message!r}")
    try:
        payload = json.dumps(message, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as err:
        raise ProtocolError(f"message is not JSON-serialisable: {err}") from None
    if len(payload) > MAX_MESSAGE_BYTES:
        raise ProtocolError(
            f"message of {len(payload)} bytes exceeds the limit of {MAX_MESSAGE_BYTES} bytes"
        )
    return _HEADER.pack(len(payload)) + payload


def decode_payload(payload: bytes) -> dict[str, Any]:
    """Decode one frame's payload (without the length prefix).

    Raises:
        ProtocolError: Not UTF-8 JSON, not an object, or no string ``type``.
    """
    try:
        message = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise ProtocolError(f"malformed message: {type(err).__name__}: {err}") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("malformed message: expected a JSON object with a string 'type'")
    return message


class FrameReader:
    """Incremental decoder for a non-blocking stream: feed bytes, iterate complete messages."""

    def __init__(self, max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self._buffer = bytearray()
        self._max = max_message_bytes

    def feed(self, data: bytes) -> Iterator[dict[str, Any]]:
        """Add received bytes and yield every message now complete.

        Raises:
            ProtocolError: A frame announces more than the size limit or is malformed; the
                stream cannot be resynchronised and should be closed.
        """
        self._buffer += data
        while len(self._buffer) >= _HEADER.size:
            (length,) = _HEADER.unpack_from(self._buffer)
            if length > self._max:
                raise ProtocolError(
                    f"frame of {length} bytes announced, limit is {self._max} bytes"
                )
            end = _HEADER.size + length
            if len(self._buffer) < end:
                return
            payload = bytes(self._buffer[_HEADER.size : end])
            del self._buffer[:end]
            yield decode_payload(payload)


def send_message(sock: socket.socket, message: dict[str, Any]) -> None:
    """Send one message on a blocking socket (or one with a timeout)."""
    sock.sendall(encode(message))


def recv_message(sock: socket.socket, timeout: float | None) -> dict[str, Any]:
    """Receive exactly one message.

    Args:
        sock: A connected stream socket.
        timeout: Seconds to wait in total; ``None`` waits forever.

    Raises:
        ProtocolError: Malformed or oversized message.
        ConnectionError: The peer closed the connection.
        TimeoutError: No complete message in time.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    header = _recv_exactly(sock, _HEADER.size, deadline)
    (length,) = _HEADER.unpack(header)
    if length > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"frame of {length} bytes announced, limit is {MAX_MESSAGE_BYTES}")
    return decode_payload(_recv_exactly(sock, length, deadline))


def recv_message_with_fds(
    sock: socket.socket, timeout: float | None, max_fds: int = 1
) -> tuple[dict[str, Any], list[int]]:
    """Receive one message whose first bytes may carry file descriptors (``SCM_RIGHTS``).

    The sender must send the whole frame in the ``sendmsg`` call that carries the fds.
    """
    sock.settimeout(timeout)
    data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE_BYTES + _HEADER.size, max_fds)
    try:
        if not data:
            raise ConnectionError("monitor closed the connection")
        if len(data) < _HEADER.size:
            raise ProtocolError("truncated frame header")
        (length,) = _HEADER.unpack_from(data)
        if length > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"frame of {length} bytes announced, limit is {MAX_MESSAGE_BYTES}")
        payload = data[_HEADER.size :]
        if len(payload) < length:
            deadline = None if timeout is None else time.monotonic() + timeout
            payload += _recv_exactly(sock, length - len(payload), deadline)
        elif len(payload) > length:
            raise ProtocolError("unexpected bytes after the handshake reply")
        return decode_payload(payload), list(fds)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _recv_exactly(sock: socket.socket, size: int, deadline: float | None) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("timed out waiting for a message")
            sock.settimeout(remaining)
        else:
            sock.settimeout(None)
        try:
            chunk = sock.recv(size - len(chunks))
        except TimeoutError:
            raise TimeoutError("timed out waiting for a message") from None
        if not chunk:
            raise ConnectionError("peer closed the connection")
        chunks += chunk
    return bytes(chunks)


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """Return ``(pid, uid, gid)`` of the process at the other end of a Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    pid, uid, gid = _PEERCRED.unpack(raw)
    return pid, uid, gid


def listen_unix(path: str, backlog: int) -> socket.socket:
    """A non-blocking Unix stream socket listening at ``path``, created with mode 0600."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        listener.bind(path)
    except BaseException:
        listener.close()
        raise
    finally:
        os.umask(old_umask)
    listener.listen(backlog)
    listener.setblocking(False)
    return listener


def check_socket_path(path: str) -> None:
    """Raise a clear error if ``path`` cannot be bound as an ``AF_UNIX`` address.

    Raises:
        ValueError: The path is longer than the kernel allows.
    """
    length = len(os.fsencode(path))
    if length > MAX_SOCKET_PATH_BYTES:
        raise ValueError(
            f"socket path {path!r} is {length} bytes long; Unix sockets allow at most "
            f"{MAX_SOCKET_PATH_BYTES}. Use a shorter directory (e.g. set TMPDIR=/tmp)."
        )


def ensure_private_dir(path: str) -> None:
    """Create ``path`` with mode 0700, or verify an existing one is private to this user.

    Raises:
        PermissionError: The directory exists but is owned by someone else or is accessible
            by group or others.
    """
    try:
        os.makedirs(path, mode=0o700, exist_ok=False)
        os.chmod(path, 0o700)  # makedirs' mode is filtered by the umask
        return
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise PermissionError(f"{path!r} exists and is not a directory")
    if info.st_uid != os.getuid():
        raise PermissionError(
            f"socket directory {path!r} belongs to uid {info.st_uid}, not to this user "
            f"(uid {os.getuid()}); use a directory you own"
        )
    if info.st_mode & 0o077:
        raise PermissionError(
            f"socket directory {path!r} has mode {stat.S_IMODE(info.st_mode):o}, so other users "
            "could reach the sockets in it; use a private directory (chmod 700)"
        )
