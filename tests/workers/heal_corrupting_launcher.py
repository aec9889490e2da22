"""``ft_launcher`` whose state transfers flip one byte of the sender's payload just before sending
(after its manifest was written and its offer verified): a corruption only the receiver's
checksum can catch. ``python heal_corrupting_launcher.py <ft_launcher arguments>``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from launcher.cli import main  # noqa: E402
from launcher.rendezvous import state_transfer  # noqa: E402

_send = state_transfer.send


def _corrupting_send(store, state, receivers, timeout):  # type: ignore[no-untyped-def]
    with open(state.payload_path, "r+b") as stream:
        stream.seek(state.bytes // 2)
        byte = stream.read(1)
        stream.seek(state.bytes // 2)
        stream.write(bytes([byte[0] ^ 0xFF]))
    print(f"heal_corrupting_launcher: flipped byte {state.bytes // 2} of {state.payload_path}", file=sys.stderr)
    return _send(store, state, receivers, timeout)


state_transfer.send = _corrupting_send

if __name__ == "__main__":
    sys.argv[0] = "ft_launcher"
    main()
