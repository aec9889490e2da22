"""Closed to strangers: who may talk to our sockets, how much they may send, and what we never do
with what they send (docs/security.md has the threat model).

The rank monitor's own checks are in tests/integration/test_monitor.py; here are the launcher's
control socket, the warm template, the trampoline's reply bound, and a scan of the packages for
deserialisers that can run code. A live ft_launcher is checked in test_security_launcher.py.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ft_core.wire import protocol
from launcher.node.control_server import ControlServer
from tests.other_user import as_nobody

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("ft_core", "launcher", "ptl_resiliency")
ZYGOTE = REPO / "launcher" / "warm" / "zygote.py"
TRAMPOLINE = REPO / "launcher" / "warm" / "trampoline.py"
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root to switch to another uid")

def request_frame(action: str = "shutdown_workload") -> bytes:
    return protocol.encode({"type": protocol.MSG_WORKLOAD_CONTROL, "action": action, "description": "x"})


def send_request(path: str, frame: bytes) -> dict | None:
    """Send one frame to the control socket from this process; the reply (None if closed)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(15)
        sock.connect(path)
        sock.sendall(frame)
        try:
            return protocol.recv_message(sock, 15)
        except ConnectionError:
            return None


# ---------------------------------------------------------------------- control socket


@pytest.fixture
def control(run_dir):
    server = ControlServer(os.path.join(run_dir, "launcher.sock"))
    yield server
    server.close()


def test_control_socket_is_0600_in_a_0700_directory(control, run_dir):
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
    mode = os.stat(control.path).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600


# A "worker" that, once told to, has a child of its own send a request and print the reply.
WORKER_WITH_A_CHILD = (
    "import subprocess, sys\n"
    "sys.stdin.readline()\n"
    "child = ('import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); '\n"
    "         's.sendall(bytes.fromhex(sys.argv[2])); print(s.recv(200))')\n"
    "print(subprocess.run([sys.executable, '-c', child, *sys.argv[1:]], capture_output=True, text=True).stdout)\n"
)


def test_control_socket_serves_only_current_workers_and_their_descendants(control):
    worker = subprocess.Popen([sys.executable, "-c", WORKER_WITH_A_CHILD, control.path, request_frame().hex()],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    control.set_workers([worker.pid])
    # This process is of the same uid, but not a worker: refused, with the reason.
    assert send_request(control.path, request_frame()) == {
        "type": protocol.MSG_ERROR, "error": "not a worker of this launcher"}
    assert control.requests.empty()
    # The worker's child is accepted.
    out, _ = worker.communicate("go\n", timeout=30)
    assert '"ok"' in out, out
    received = control.requests.get(timeout=5)
    assert received.request.action.name == "ShutdownWorkload"
    assert received.sender_pid != worker.pid
    # Once the workers change (a new cycle), the old ones are strangers.
    control.set_workers([])
    assert send_request(control.path, request_frame())["type"] == protocol.MSG_ERROR


def test_a_worker_forked_by_the_warm_template_is_a_worker(control, run_dir):
    # With warm restarts torch knows the trampoline; the real worker is the template's child.
    template = start_zygote(os.path.join(run_dir, "warm.sock"))
    try:
        trampoline = subprocess.Popen(
            [sys.executable, "-I", "-S", str(TRAMPOLINE), "-c",
             "import os, socket, sys\n"
             "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(bytes.fromhex(sys.argv[2]))\n"
             "print(os.getppid(), s.recv(200))",
             control.path, request_frame().hex()],
            env={**os.environ, "FT_WARM_TEMPLATE_SOCKET": os.path.join(run_dir, "warm.sock")},
            stdout=subprocess.PIPE, text=True)
        control.set_workers([trampoline.pid], template_pid=template.pid)
        out, _ = trampoline.communicate(timeout=30)
        ppid, reply = out.split(" ", 1)
        assert int(ppid) == template.pid, "the worker was not forked by the template"
        assert '"ok"' in reply, reply
        assert control.requests.get(timeout=5).request.action.name == "ShutdownWorkload"
    finally:
        stop(template)


def test_control_socket_refuses_oversized_and_malformed_requests(control):
    control.set_workers([os.getpid()])
    huge = struct.pack("!I", protocol.MAX_MESSAGE_BYTES + 1)  # refused from the header alone
    reply = send_request(control.path, huge)
    assert reply["type"] == protocol.MSG_ERROR and "limit" in reply["error"]
    reply = send_request(control.path, protocol.encode({"type": "workload_control", "action": "reboot_the_node"}))
    assert reply["type"] == protocol.MSG_ERROR and "unknown workload action" in reply["error"]
    reply = send_request(control.path, protocol.encode({"type": "init"}))
    assert reply["type"] == protocol.MSG_ERROR and "unexpected message type" in reply["error"]
    assert control.requests.empty()
    assert send_request(control.path, request_frame())["type"] == protocol.MSG_OK


@needs_root
def test_control_socket_refuses_other_users(control, run_dir):
    control.set_workers([os.getpid()])
    # Layer 1: the 0700 directory keeps other users from reaching the socket at all.
    assert as_nobody(control.path, request_frame())["connect"] == "Permission denied"
    # Layer 2: even with the directory and the socket opened up, SO_PEERCRED refuses them.
    os.chmod(run_dir, 0o711)
    os.chmod(control.path, 0o666)
    assert as_nobody(control.path, request_frame()) == {"connect": "ok", "reply": "<closed>"}
    assert control.requests.empty()
    assert send_request(control.path, request_frame())["type"] == protocol.MSG_OK  # still serves us


# ---------------------------------------------------------------------- warm template


def start_zygote(path: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(ZYGOTE), "--socket", path, "--parent-pid", str(os.getpid()),
                             "--preload", ""], stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        assert proc.poll() is None and time.monotonic() < deadline, "the warm template did not start"
        time.sleep(0.02)
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)


def closed_without_answer(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(100) == b""
    except ConnectionError:
        return True


@pytest.fixture
def template(run_dir):
    proc = start_zygote(os.path.join(run_dir, "warm.sock"))
    yield proc, os.path.join(run_dir, "warm.sock")
    stop(proc)


def test_warm_template_socket_is_0600(template):
    _, path = template
    mode = os.stat(path).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600


def test_only_children_of_the_launcher_may_ask_the_template_to_fork(template):
    proc, path = template
    # This process is the template's "launcher" (its --parent-pid), not a child of it: refused.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        assert closed_without_answer(sock)
    # A grandchild of the launcher (a worker's child, say) is refused too.
    code = ("import socket, subprocess, sys\n"
            "inner = 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.settimeout(10); "
            "print(s.recv(10) == bytes())'\n"
            "print(subprocess.run([sys.executable, '-c', inner, sys.argv[1]], capture_output=True, text=True).stdout)")
    out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "True", out
    assert proc.poll() is None


def test_warm_template_drops_an_oversized_request_unread(template):
    proc, path = template
    code = ("import socket, struct, sys\n"
            "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.settimeout(10)\n"
            "s.sendall(struct.pack('!I', 4 * 1024 * 1024 + 1))\n"
            "print(s.recv(10) == bytes())")
    out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "True", out
    assert proc.poll() is None


@needs_root
def test_warm_template_refuses_other_users(template, run_dir):
    proc, path = template
    spawn = json.dumps({"type": "spawn", "argv": ["-c", "pass"], "env": {}, "cwd": "/"}).encode()
    frame = struct.pack("!I", len(spawn)) + spawn
    assert as_nobody(path, frame)["connect"] == "Permission denied"
    os.chmod(run_dir, 0o711)
    os.chmod(path, 0o666)
    # A child of the launcher, but of another uid: closed before anything is read.
    assert as_nobody(path, frame) == {"connect": "ok", "reply": "<closed>"}
    assert proc.poll() is None


# ---------------------------------------------------------------------- trampoline


def test_trampoline_bounds_the_template_reply_and_starts_cold(run_dir):
    path = os.path.join(run_dir, "fake-warm.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def answer_with_a_huge_frame() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(struct.pack("!I", 2**31) + b"x" * 100)
            conn.recv(1)

    thread = threading.Thread(target=answer_with_a_huge_frame, daemon=True)
    thread.start()
    try:
        out = subprocess.run([sys.executable, "-I", "-S", str(TRAMPOLINE), "-c", "import os; print(os.getpid())"],
                             env={**os.environ, "FT_WARM_TEMPLATE_SOCKET": path}, capture_output=True, text=True,
                             timeout=30)
    finally:
        thread.join(10)
        server.close()
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().isdigit()  # ran cold, in the trampoline's own process


# ---------------------------------------------------------------------- no code from data

FORBIDDEN_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve", "jsonpickle"}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}
# Deliberate, reviewed exceptions: (file, what).
ALLOWED = {
    # The warm template runs the *user's own training script* (the trampoline's argv), exactly as
    # `python script.py` would; only this launcher's children, same uid, may ask (security.md).
    ("launcher/warm/zygote.py", "runpy.run_path"),
    ("launcher/warm/zygote.py", "runpy.run_module"),
    # A local checkpoint: this rank's own checksummed file or a replica from a rank of the same job
    # (its process group), loaded with weights_only as Lightning's load asks (torch's safe default).
    ("ft_core/checkpointing/local/ckpt_managers/base_manager.py", "torch.load"),
    # A Lightning run resumes from its just-in-time state: Lightning's own checkpoint dict, read as
    # Lightning reads a checkpoint (it holds hyperparameters, not only tensors). The file is this
    # job's: written 0600 in the launcher's 0700 run dir (or a peer node's copy) and checked against
    # its manifest's SHA-256 first (docs/security.md).
    ("ptl_resiliency/_jit_restore.py", "torch.load"),
}


def violations(source: str, filename: str) -> list[str]:
    """Ways in which ``source`` could turn data into code."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [(node.module or "").split(".")[0]]
        else:
            names = []
        found += [f"{filename}:{node.lineno}: imports {name}" for name in names if name in FORBIDDEN_MODULES]
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        dotted = ast.unparse(func)
        keywords = {kw.arg: kw.value for kw in node.keywords}
        if isinstance(func, ast.Name) and func.id in FORBIDDEN_CALLS:
            found.append(f"{filename}:{node.lineno}: calls {func.id}()")
        elif dotted in ("yaml.load", "yaml.load_all"):
            loader = keywords.get("Loader")
            if loader is None or ast.unparse(loader) not in ("yaml.SafeLoader", "yaml.CSafeLoader"):
                found.append(f"{filename}:{node.lineno}: {dotted} without SafeLoader")
        elif dotted == "torch.load":
            safe = keywords.get("weights_only")  # torch's restricted unpickler: tensors and plain values only
            if not (isinstance(safe, ast.Constant) and safe.value is True) and (filename, dotted) not in ALLOWED:
                found.append(f"{filename}:{node.lineno}: calls {dotted}")
        elif dotted in ("yaml.unsafe_load", "yaml.full_load", "yaml.unsafe_load_all", "yaml.full_load_all",
                        "os.system", "os.popen"):
            found.append(f"{filename}:{node.lineno}: calls {dotted}")
        elif dotted.startswith("runpy.") and (filename, dotted) not in ALLOWED:
            found.append(f"{filename}:{node.lineno}: calls {dotted}")
        elif dotted.startswith("subprocess.") and "shell" in keywords:
            if not (isinstance(keywords["shell"], ast.Constant) and keywords["shell"].value is False):
                found.append(f"{filename}:{node.lineno}: {dotted}(shell=...)")
    return found


def test_the_scan_finds_what_it_looks_for():
    sample = ("import pickle\nfrom marshal import loads\nimport yaml, torch, subprocess, runpy\n"
              "eval('1')\nexec('x=1')\nyaml.load(s)\nyaml.load(s, Loader=yaml.Loader)\n"
              "yaml.load(s, Loader=yaml.SafeLoader)\ntorch.load(p)\nsubprocess.run(c, shell=True)\n"
              "runpy.run_path(p)\n")
    found = violations(sample, "sample.py")
    assert len(found) == 9, found
    assert not any(":8:" in item for item in found)  # the SafeLoader call is fine


@pytest.mark.parametrize("package", PACKAGES)
def test_no_deserialiser_or_evaluator_that_can_run_code(package):
    found = []
    for path in sorted((REPO / package).rglob("*.py")):
        found += violations(path.read_text(), str(path.relative_to(REPO)))
    assert not found, "\n".join(found)


def test_yaml_is_read_with_safe_load_only():
    uses = [f"{p.relative_to(REPO)}:{n}" for package in PACKAGES for p in (REPO / package).rglob("*.py")
            for n, line in enumerate(p.read_text().splitlines(), 1) if "yaml." in line and "load" in line]
    assert uses and all("safe_load" in Path(REPO / u.split(":")[0]).read_text().splitlines()[int(u.split(":")[1]) - 1]
                        for u in uses), uses
