"""Wire protocol between ranks, rank monitors and the launcher.

Every message is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON encoding
one object with a string ``"type"``. Messages larger than :data:`MAX_MESSAGE_BYTES` are refused
by both sides. JSON is the only decoder used on anything read from a socket: no pickle, no eval.

Security comes from the socket itself, not from where it lies: a socket file is bound with mode
0600 from birth, and *both* ends check the other's uid with ``SO_PEERCRED`` (the same user only).
A socket directory may therefore be any directory the caller picks (``/tmp``, ``$TMPDIR``, a 0755
job directory) except one where another user could swap the socket file: one that others can
write to without the sticky bit, or that belongs to another user (:func:`unsafe_dir_reason`).

The socket primitives every side uses live here: :func:`listen_unix` (bound 0600 from birth),
:func:`accept_own_user` (the one accept path of every server: other uids are refused),
:func:`connect_unix` (the one way a client socket is opened: a server of another uid is refused
before a byte is sent) and :func:`ensure_socket_dir`. The warm-start trampoline, which must stay
standard-library only and light, repeats the client's uid check (``launcher/warm/trampoline.py``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import stat
import struct
import time
from collections.abc import Iterator
from typing import Any, Union

from ft_core.wire.errors import ProtocolError

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 64 * 1024
# sockaddr_un.sun_path is 108 bytes on Linux, including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107

Logger = Union[logging.Logger, logging.LoggerAdapter]

_HEADER = struct.Struct("!I")
_PEERCRED = struct.Struct("3i")

# Message types: every "type" string of every socket, defined here once. Wire values never
# change (a rank and a monitor of different versions must at least refuse each other clearly).
# Rank (client) -> monitor:
MSG_INIT = "init"
MSG_SET_HB_TIMEOUTS = "set_hb_timeouts"
MSG_SET_SECTION_TIMEOUTS = "set_section_timeouts"
MSG_SHUTDOWN = "shutdown"
MSG_STATE_CHANNEL = "state_channel"  # first message of a rank's second connection (just-in-time state)
MSG_STATE_SAVED = "state_saved"  # rank -> monitor on the state channel; monitor -> launcher
MSG_RESUMED = "resumed"  # once, after the rank restored its training state (what a failure cost: ft_report)
# Monitor -> rank, launcher control socket -> rank (replies):
MSG_INIT_OK = "init_ok"
MSG_OK = "ok"
MSG_ERROR = "error"
# Launcher -> monitor:
MSG_LAUNCHER_HELLO = "launcher_hello"
MSG_WORKER_STARTED = "worker_started"
MSG_LAUNCHER_BYE = "launcher_bye"
MSG_PING = "ping"
MSG_PROGRESS_QUERY = "progress_query"
MSG_CAPTURE_STACKS = "capture_stacks"
MSG_SAVE_STATE = "save_state"  # also monitor -> rank on the state channel
# Monitor -> launcher:
MSG_RANK_HANG = "rank_hang"
MSG_RANK_CONNECTED = "rank_connected"
MSG_PONG = "pong"
MSG_PROGRESS_REPORT = "progress_report"
MSG_STACKS_CAPTURED = "stacks_captured"
MSG_RANK_ESCALATED = "rank_escalated"
MSG_RANK_FINISHED = "rank_finished"
MSG_RANK_RESUMED = "rank_resumed"
# Rank -> launcher control socket:
MSG_WORKLOAD_CONTROL = "workload_control"
MSG_STRAGGLER_REPORT = "straggler_report"
# Trampoline -> warm template, and its replies:
MSG_SPAWN = "spawn"
MSG_SPAWNED = "spawned"
MSG_EXITED = "exited"
# Not on any wire: what the launcher's monitor pool reports when a monitor's link breaks.
MSG_MONITOR_LOST = "monitor_lost"

MESSAGE_TYPES = frozenset(
    value for name, value in dict(globals()).items() if name.startswith("MSG_") and name != "MSG_MONITOR_LOST"
)
"""Every message type that travels on a socket."""


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


def send_message_with_fds(sock: socket.socket, message: dict[str, Any], fds: list[int]) -> None:
    """Send one message with ``fds`` attached to its first bytes (``SCM_RIGHTS``)."""
    frame = encode(message)
    if not fds:
        sock.sendall(frame)
        return
    sent = socket.send_fds(sock, [frame], fds)
    if sent < len(frame):
        sock.sendall(frame[sent:])


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
    """Return ``(pid, uid, gid)`` of the process at the other end of a Unix socket.

    For a server this is the connecting process; for a client, the process that called
    ``listen`` on the server's socket.
    """
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    pid, uid, gid = _PEERCRED.unpack(raw)
    return pid, uid, gid


def foreign_peer(sock: socket.socket) -> tuple[int, int] | None:
    """``(pid, uid)`` of the peer when it runs as another user than this process, else None.

    The one uid check of both ends: :func:`accept_own_user` (servers) and :func:`connect_unix`
    (clients) call it.
    """
    pid, uid, _gid = peer_credentials(sock)
    return None if uid == os.getuid() else (pid, uid)


class ForeignServerError(PermissionError):
    """A client reached a socket served by another user (see :func:`connect_unix`)."""


def listen_unix(path: str, backlog: int) -> socket.socket:
    """A non-blocking Unix stream socket listening at ``path``, created with mode 0600.

    The mode is set by the umask in force during ``bind``, so the file never exists with a
    wider mode (no window between creation and a ``chmod``).
    """
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


def accept_own_user(listener: socket.socket, log: Logger, what: str) -> Iterator[tuple[socket.socket, int]]:
    """Accept every connection pending on a non-blocking ``listener``; yield those of this user.

    A connection from another uid (``SO_PEERCRED``) is closed unanswered, with one WARNING line
    naming ``what`` (the socket's role), the peer's pid and uid. A failed ``accept`` other than
    "nothing pending" ends the round with a WARNING; the listener stays registered, so the next
    readiness tries again. What else a server checks (a connection limit, the peer's ancestry)
    is its own.

    Yields:
        ``(connected socket, peer pid)``; the caller owns the socket.
    """
    while True:
        try:
            sock, _addr = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as err:
            log.warning("%s: accept failed: %s", what, err)
            return
        stranger = foreign_peer(sock)
        if stranger is not None:
            log.warning("%s: refused connection from pid %s: uid %s is not this user's uid %s",
                        what, stranger[0], stranger[1], os.getuid())
            sock.close()
            continue
        yield sock, peer_credentials(sock)[0]


def connect_unix(path: str, timeout: float, what: str = "server") -> socket.socket:
    """A Unix stream socket connected to ``path``, with ``timeout`` for the connect and later I/O.

    The one place a client socket is opened (rank -> monitor, rank -> launcher, launcher ->
    monitor). The server must run as this user: its uid (``SO_PEERCRED``) is checked right
    after the connect, before anything is sent, so a stranger listening at the path (e.g. after
    swapping a directory) learns nothing and cannot pose as our server.

    Args:
        path: The server's socket.
        timeout: Seconds for the connect and for later I/O on the socket.
        what: The server's role, for the error message (e.g. ``"rank monitor"``).

    Raises:
        ForeignServerError: The socket is served by another user (the socket is closed).
        OSError: The connect failed (the socket is closed).
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        stranger = foreign_peer(sock)
    except BaseException:
        sock.close()
        raise
    if stranger is not None:
        sock.close()
        raise ForeignServerError(
            f"the {what} socket {path} is served by pid {stranger[0]} of uid {stranger[1]}, not by "
            f"this user (uid {os.getuid()}); refusing to talk to it (another user may be "
            "impersonating it: check who can write to the socket's directory)"
        )
    return sock


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


def unsafe_dir_reason(path: str) -> str | None:
    """Why another user could replace a socket file in directory ``path``; None if no one can.

    Another user can rename or delete the entries of a directory they may write to, unless the
    directory has the sticky bit (then only an entry's owner may, as in ``/tmp``), and the owner
    of a directory can always do so. So a directory is unsafe for sockets when it belongs to
    another user (root aside: root can do anything anyway), or when group or others may write to
    it and it lacks the sticky bit. Group-writable counts: the group's other members are other
    users. Parent directories are not checked: with both ends checking the peer's uid, a swapped
    socket can make a connection fail, never make it reach a stranger.

    Raises:
        OSError: ``path`` cannot be examined (e.g. it does not exist).
    """
    info = os.stat(path)
    if not stat.S_ISDIR(info.st_mode):
        return f"{path!r} is not a directory"
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid not in (os.getuid(), 0):
        return (f"directory {path!r} belongs to uid {info.st_uid}, not to this user (uid {os.getuid()}), "
                "and its owner could replace the sockets in it")
    if mode & 0o022 and not mode & stat.S_ISVTX:
        who = "others" if mode & 0o002 else "its group"
        return (f"directory {path!r} (mode {mode:o}) is writable by {who} without the sticky bit, so "
                "another user could replace the sockets in it")
    return None


def ensure_socket_dir(path: str) -> None:
    """Make ``path`` fit for a server socket: create it (mode 0700) if missing, else check it.

    Any existing directory is fine (``/tmp``, ``$TMPDIR``, a 0755 ``mkdtemp``/``mkdir`` or job
    directory) unless another user could swap the socket in it (:func:`unsafe_dir_reason`).

    Raises:
        PermissionError: The directory is unsafe; the message says why and what to do.
    """
    try:
        os.makedirs(path, mode=0o700, exist_ok=False)
        os.chmod(path, 0o700)  # makedirs' mode is filtered by the umask
        return
    except FileExistsError:
        pass
    reason = unsafe_dir_reason(path)
    if reason is not None:
        raise PermissionError(
            f"refusing to put a socket in {path!r}: {reason}. Use a directory of your own "
            "(e.g. one made by tempfile.mkdtemp()), or one with the sticky bit such as /tmp"
        )


def prepare_socket_path(path: str) -> None:
    """Everything a server checks before :func:`listen_unix` at ``path``.

    The path must fit a Unix socket address, its directory must be safe
    (:func:`ensure_socket_dir`), and an old socket of this user at the path (left by a process
    that died) is removed. Anything else at the path is left alone.

    Raises:
        ValueError: The path is too long for a Unix socket.
        PermissionError: The directory is unsafe, or the socket file there belongs to another user.
        FileExistsError: Something other than a socket exists at the path.
    """
    check_socket_path(path)
    ensure_socket_dir(os.path.dirname(path) or ".")
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise FileExistsError(f"{path!r} exists and is not a socket; refusing to replace it")
    if info.st_uid != os.getuid():
        raise PermissionError(
            f"socket {path!r} belongs to uid {info.st_uid}, not to this user (uid {os.getuid()}); "
            "refusing to replace it"
        )
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
