"""``RankMonitorClient``: the per-rank handle on hang detection.

Call order (seeds 000 and 003):

1. ``init_workload_monitoring()`` connects to this rank's monitor (path from
   ``FT_RANK_MONITOR_IPC_SOCKET``, set by ``ft_launcher``) and receives the effective config.
2. Optionally ``load_state_dict()`` with timeouts saved by an earlier run (before or after 1).
3. ``send_heartbeat()`` periodically and/or ``start_section(name)`` / ``end_section(name)``.
4. Optionally ``calculate_and_set_hb_timeouts()`` / ``calculate_and_set_section_timeouts()``
   once enough intervals were observed (collective when a process group exists).
5. Optionally save ``state_dict()`` for the next run.
6. ``shutdown_workload_monitoring()``.

Hot path: a heartbeat or section call stores a timestamp into memory shared with the monitor and
updates the local interval statistics; it makes no system call and never waits. If the monitor
dies, those stores go nowhere and training continues (fail-open); the client notices at its next
liveness check (at most once a second) and logs it once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import struct
import threading
import time
import weakref
from typing import Any, Optional

from ft_core import protocol
from ft_core.config import FaultToleranceConfig
from ft_core.env import FT_LAUNCHER_IPC_SOCKET_ENV_VAR, FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR
from ft_core.errors import ProtocolError, RankMonitorClientError
from ft_core.progress_slot import (
    OFF_HEARTBEAT_COUNT,
    OFF_LAST_HEARTBEAT,
    OFF_LAST_SECTION_ACTIVITY,
    OFF_OUT_OF_SECTION_SINCE,
    ProgressSlot,
    section_offset,
)
from ft_core.timeouts import (
    MIN_CALCULATED_INITIAL_TIMEOUT,
    HeartbeatTimeouts,
    SectionTimeouts,
    TimeoutsCalc,
    blend,
)
from ft_core.workload_control import WorkloadControlRequest

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT = 30.0
REPLY_TIMEOUT = 10.0
LIVENESS_CHECK_INTERVAL = 1.0
STATE_DICT_VERSION = 1

_pack_f64 = struct.Struct("=d").pack_into
_pack_u64 = struct.Struct("=Q").pack_into
_monotonic = time.monotonic

# Clients whose socket must not leak into forked children (data-loader workers): a child
# holding the socket open would hide the rank's death from the monitor.
_live_clients: weakref.WeakSet[RankMonitorClient] = weakref.WeakSet()


def _close_sockets_in_child() -> None:
    for client in list(_live_clients):
        client._forget_after_fork()


os.register_at_fork(after_in_child=_close_sockets_in_child)


class RankMonitorClient:
    """Connects one rank to its rank monitor; see the module docstring for the call order.

    Attributes:
        cfg: The effective config received from the monitor (``None`` before init).
        hb_timeouts: Current heartbeat timeouts.
        section_timeouts: Current section timeouts.
    """

    def __init__(self) -> None:
        self.cfg: FaultToleranceConfig | None = None
        self.hb_timeouts = HeartbeatTimeouts()
        self.section_timeouts = SectionTimeouts()
        self._sock: socket.socket | None = None
        self._slot: ProgressSlot | None = None
        self._mm: Any = None
        self._calc: TimeoutsCalc | None = None
        self._section_offsets: dict[str, int] = {}  # byte offset in the slot, set while initialised
        self._open_sections: dict[str, float] = {}
        self._heartbeats = 0
        self._loaded_state: dict[str, Any] | None = None
        self._next_liveness_check = 0.0
        self._monitor_lost = False
        self._lock = threading.Lock()  # serialises control-message round trips
        self.rank_info: dict[str, Any] = {}

    # ------------------------------------------------------------------ life cycle

    @property
    def is_initialized(self) -> bool:
        """True between ``init_workload_monitoring`` and ``shutdown_workload_monitoring``."""
        return self._mm is not None

    def init_workload_monitoring(self) -> None:
        """Connect to this rank's monitor and start being watched.

        Raises:
            RankMonitorClientError: Not started by ``ft_launcher`` (socket variable unset),
                already initialised, or the monitor cannot be reached.
        """
        if self.is_initialized:
            raise RankMonitorClientError(
                "init_workload_monitoring() was called twice; call "
                "shutdown_workload_monitoring() first"
            )
        path = os.environ.get(FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR)
        if not path:
            raise RankMonitorClientError(
                f"{FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR} is not set: this process was not started "
                "by ft_launcher. Start training with `ft_launcher [torchrun options] script.py`, "
                "or point the variable at the socket of a running rank monitor."
            )
        self.rank_info = _rank_info_from_env()
        sock = self._connect(path)
        try:
            protocol.send_message(sock, {
                "type": protocol.MSG_INIT, "protocol": protocol.PROTOCOL_VERSION,
                **self.rank_info,
            })
            reply, fds = protocol.recv_message_with_fds(sock, REPLY_TIMEOUT)
        except (OSError, ProtocolError, TimeoutError) as err:
            sock.close()
            raise RankMonitorClientError(f"handshake with the rank monitor at {path} failed: {err}") from None
        try:
            if reply["type"] == protocol.MSG_ERROR:
                raise RankMonitorClientError(f"rank monitor refused this rank: {reply.get('error')}")
            if reply["type"] != protocol.MSG_INIT_OK or len(fds) != 1:
                raise RankMonitorClientError(f"unexpected reply from the rank monitor: {reply['type']!r}")
            self.cfg = FaultToleranceConfig.from_dict(reply["config"])
            sections = list(reply["sections"])
            slot = ProgressSlot.attach(fds[0], len(sections))
        except (KeyError, TypeError, ValueError) as err:
            sock.close()
            raise RankMonitorClientError(f"invalid handshake reply from the rank monitor: {err}") from None
        except BaseException:
            sock.close()
            raise
        finally:
            for fd in fds:
                os.close(fd)
        # Blocking mode without timeout: the liveness probe's MSG_DONTWAIT recv must be a
        # plain system call (with a timeout set, Python would first wait for readability).
        sock.settimeout(None)
        self._sock = sock
        self._slot = slot
        self._section_offsets = {name: section_offset(i) for i, name in enumerate(sections)}
        self._open_sections = {}
        self._heartbeats = 0
        self._monitor_lost = False
        now = _monotonic()
        self._calc = TimeoutsCalc(sections, self.cfg.safety_factor, start_time=now)
        self._next_liveness_check = now + LIVENESS_CHECK_INTERVAL
        self.hb_timeouts = HeartbeatTimeouts(
            self.cfg.initial_rank_heartbeat_timeout, self.cfg.rank_heartbeat_timeout
        )
        self.section_timeouts = SectionTimeouts(
            section=dict(self.cfg.rank_section_timeouts),
            out_of_section=self.cfg.rank_out_of_section_timeout,
        )
        self._mm = slot.buffer
        _live_clients.add(self)
        if self._loaded_state is not None:
            state, self._loaded_state = self._loaded_state, None
            self._apply_state(state)
        logger.debug("rank %s: connected to rank monitor at %s", self.rank_info.get("rank"), path)

    def shutdown_workload_monitoring(self) -> None:
        """Stop being watched and disconnect. Safe to call more than once."""
        if not self.is_initialized:
            return
        with contextlib.suppress(RankMonitorClientError):
            self._request({"type": protocol.MSG_SHUTDOWN}, quiet=True)
        self._release()

    def _release(self) -> None:
        _live_clients.discard(self)
        self._mm = None
        self._section_offsets = {}
        if self._slot is not None:
            with contextlib.suppress(BufferError, ValueError):
                self._slot.close()
            self._slot = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._open_sections = {}

    def _forget_after_fork(self) -> None:
        # In a forked child: close our copy of the socket, stop writing to the parent's slot.
        self._mm = None
        self._section_offsets = {}
        self._slot = None
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

    @staticmethod
    def _connect(path: str) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            sock.connect(path)
        except OSError as err:
            sock.close()
            raise RankMonitorClientError(
                f"cannot connect to the rank monitor at {path}: {err.strerror or err}. Is "
                "ft_launcher still running, and was this rank started by it?"
            ) from None
        return sock

    # ------------------------------------------------------------------ hot path

    def send_heartbeat(self) -> None:
        """Tell the monitor this rank is alive. Never blocks.

        Raises:
            RankMonitorClientError: The client is not initialised.
        """
        mm = self._mm
        if mm is None:
            raise self._not_initialized("send_heartbeat")
        now = _monotonic()
        self._calc.on_heartbeat(now)
        self._heartbeats += 1
        _pack_f64(mm, OFF_LAST_HEARTBEAT, now)
        _pack_u64(mm, OFF_HEARTBEAT_COUNT, self._heartbeats)
        if now >= self._next_liveness_check:
            self._check_monitor(now)

    def start_section(self, section: str) -> None:
        """Open ``section``; it must be configured and not already open. Never blocks.

        Raises:
            RankMonitorClientError: Not initialised, unknown section, or already open.
        """
        offset = self._section_offsets.get(section)  # empty unless initialised
        if offset is None:
            raise self._section_error("start_section", section)
        open_sections = self._open_sections
        if section in open_sections:
            raise RankMonitorClientError(
                f"section {section!r} is already open; call end_section({section!r}) first"
            )
        now = _monotonic()
        mm = self._mm
        open_sections[section] = now
        # Order matters for a concurrent reader: publish the open section before clearing
        # the out-of-section clock (see progress_slot).
        _pack_f64(mm, offset, now)
        if len(open_sections) == 1:
            self._calc.on_section_start(now, True)
            _pack_f64(mm, OFF_OUT_OF_SECTION_SINCE, 0.0)
        _pack_f64(mm, OFF_LAST_SECTION_ACTIVITY, now)
        if now >= self._next_liveness_check:
            self._check_monitor(now)

    def end_section(self, section: str) -> None:
        """Close ``section``, which must be open. Never blocks.

        Raises:
            RankMonitorClientError: Not initialised, unknown section, or not open.
        """
        started = self._open_sections.pop(section, None)
        if started is None:
            raise self._section_error("end_section", section)
        now = _monotonic()
        mm = self._mm
        last_closed = not self._open_sections
        self._calc.on_section_end(section, now - started, now, last_closed)
        if last_closed:
            _pack_f64(mm, OFF_OUT_OF_SECTION_SINCE, now)
        _pack_f64(mm, self._section_offsets[section], 0.0)
        _pack_f64(mm, OFF_LAST_SECTION_ACTIVITY, now)

    def _section_error(self, call: str, section: str) -> RankMonitorClientError:
        if self._mm is None:
            return self._not_initialized(call)
        if section not in self._section_offsets:
            return self._unknown_section(section)
        return RankMonitorClientError(
            f"end_section({section!r}) without a matching start_section({section!r})"
        )

    def end_all_sections(self) -> None:
        """Close every open section (e.g. before a checkpoint that is out of any section)."""
        for section in list(self._open_sections):
            self.end_section(section)

    @property
    def open_sections(self) -> tuple[str, ...]:
        """Names of the sections currently open."""
        return tuple(self._open_sections)

    def _not_initialized(self, call: str) -> RankMonitorClientError:
        return RankMonitorClientError(
            f"{call}() called on a RankMonitorClient that is not initialised; call "
            "init_workload_monitoring() first (and not after shutdown_workload_monitoring())"
        )

    def _unknown_section(self, section: str) -> RankMonitorClientError:
        known = ", ".join(sorted(self._section_offsets)) or "none"
        return RankMonitorClientError(
            f"section {section!r} is not configured (configured sections: {known}); add it to "
            "rank_section_timeouts, e.g. --ft-param-rank_section_timeouts="
            f"{section}:600"
        )

    # ------------------------------------------------------------------ monitor liveness

    def _check_monitor(self, now: float) -> None:
        self._next_liveness_check = now + LIVENESS_CHECK_INTERVAL
        sock = self._sock
        if sock is None or self._monitor_lost:
            return
        try:
            data = sock.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._on_monitor_lost("the rank monitor closed the connection")

    def _on_monitor_lost(self, why: str) -> None:
        if not self._monitor_lost:
            self._monitor_lost = True
            logger.error(
                "rank %s: %s; hang detection is off for this rank, training continues",
                self.rank_info.get("rank"), why,
            )

    def _request(self, message: dict[str, Any], quiet: bool = False) -> bool:
        """Send a control message and wait for the monitor's reply.

        Returns:
            True if the monitor accepted it, False if the monitor is gone (fail-open).

        Raises:
            RankMonitorClientError: The monitor rejected the request.
        """
        if self._monitor_lost or self._sock is None:
            return False
        with self._lock:
            try:
                protocol.send_message(self._sock, message)
                reply = protocol.recv_message(self._sock, REPLY_TIMEOUT)
                self._sock.settimeout(None)
            except (OSError, ProtocolError, TimeoutError) as err:
                if not quiet:
                    self._on_monitor_lost(f"the rank monitor did not answer ({err})")
                self._monitor_lost = True
                return False
        if reply["type"] == protocol.MSG_ERROR:
            raise RankMonitorClientError(f"rank monitor rejected {message['type']}: {reply.get('error')}")
        return True

    # ------------------------------------------------------------------ timeouts

    def calculate_and_set_hb_timeouts(self, skip_if_not_ready: bool = False) -> bool:
        """Calculate heartbeat timeouts from observed intervals and send them to the monitor.

        With a ``torch.distributed`` process group this is a collective: every rank must call
        it, and all get the same timeouts. New values are blended with earlier calculated
        ones (EMA).

        Args:
            skip_if_not_ready: Return False instead of raising when fewer than two heartbeats
                were observed (on any rank).

        Returns:
            True if timeouts were calculated and set.

        Raises:
            RankMonitorClientError: Not initialised, or not enough data and not skipping.
        """
        calc = self._require_calc("calculate_and_set_hb_timeouts")
        calc.synchronize_all()
        if not calc.can_get_hb_timeouts():
            if skip_if_not_ready:
                logger.debug("not enough heartbeats to calculate timeouts yet; skipped")
                return False
            raise RankMonitorClientError(
                "cannot calculate heartbeat timeouts yet: at least two heartbeats must be sent "
                "after init_workload_monitoring() (pass skip_if_not_ready=True to skip)"
            )
        initial, subsequent = calc.heartbeat_timeouts()
        previous = self.hb_timeouts
        new = HeartbeatTimeouts(
            initial=blend(previous.initial, initial, previous.were_calculated, MIN_CALCULATED_INITIAL_TIMEOUT),
            subsequent=blend(previous.subsequent, subsequent, previous.were_calculated),
            were_calculated=True,
        )
        self.hb_timeouts = new
        self._send_hb_timeouts()
        logger.info(
            "rank %s: calculated heartbeat timeouts initial=%.1fs subsequent=%.1fs",
            self.rank_info.get("rank"), new.initial, new.subsequent,
        )
        return True

    def calculate_and_set_section_timeouts(
        self,
        selected_sections: Optional[list[str]] = None,
        calc_out_of_section: bool = True,
        skip_if_not_ready: bool = False,
    ) -> bool:
        """Calculate section timeouts from observed durations and send them to the monitor.

        A collective when a process group exists (see :meth:`calculate_and_set_hb_timeouts`);
        every rank must pass the same arguments.

        Args:
            selected_sections: Sections to update (default: all configured).
            calc_out_of_section: Also update the out-of-section timeout.
            skip_if_not_ready: Return False instead of raising when a selected section (or
                out-of-section time) was never observed.

        Returns:
            True if timeouts were calculated and set.

        Raises:
            RankMonitorClientError: Not initialised, unknown section, or not enough data and not
                skipping.
        """
        calc = self._require_calc("calculate_and_set_section_timeouts")
        selected = sorted(self._section_offsets) if selected_sections is None else list(selected_sections)
        for name in selected:
            if name not in self._section_offsets:
                raise self._unknown_section(name)
        calc.synchronize_all()
        missing = calc.missing_sections(selected, calc_out_of_section)
        if missing:
            if skip_if_not_ready:
                logger.debug("not enough data for section timeouts (%s); skipped", ", ".join(missing))
                return False
            raise RankMonitorClientError(
                "cannot calculate section timeouts yet, never observed: " + ", ".join(missing) +
                " (pass skip_if_not_ready=True to skip)"
            )
        sections, oos = calc.section_timeouts(selected, calc_out_of_section)
        previous = self.section_timeouts
        merged = dict(previous.section)
        for name, value in sections.items():
            merged[name] = blend(previous.section.get(name), value, name in previous.calculated_sections)
        new = SectionTimeouts(
            section=merged,
            out_of_section=previous.out_of_section,
            calculated_sections=sorted(set(previous.calculated_sections) | set(sections)),
            is_out_of_section_calculated=previous.is_out_of_section_calculated,
        )
        if oos is not None:
            new.out_of_section = blend(previous.out_of_section, oos, previous.is_out_of_section_calculated)
            new.is_out_of_section_calculated = True
        self.section_timeouts = new
        self._send_section_timeouts()
        logger.info(
            "rank %s: calculated section timeouts %s, out-of-section=%s",
            self.rank_info.get("rank"),
            ", ".join(f"{k}={v:.1f}s" for k, v in sorted(sections.items())) or "-",
            f"{new.out_of_section:.1f}s" if new.out_of_section is not None else "inf",
        )
        return True

    def _require_calc(self, call: str) -> TimeoutsCalc:
        if self._calc is None or not self.is_initialized:
            raise self._not_initialized(call)
        return self._calc

    def _send_hb_timeouts(self) -> None:
        self._request({
            "type": protocol.MSG_SET_HB_TIMEOUTS,
            "initial": self.hb_timeouts.initial,
            "subsequent": self.hb_timeouts.subsequent,
        })

    def _send_section_timeouts(self) -> None:
        known = {k: v for k, v in self.section_timeouts.section.items() if k in self._section_offsets}
        self._request({
            "type": protocol.MSG_SET_SECTION_TIMEOUTS,
            "section": known,
            "out_of_section": self.section_timeouts.out_of_section,
        })

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Timeouts as a JSON-serialisable dict, identical on all ranks after a calculation."""
        return {
            "version": STATE_DICT_VERSION,
            "hb_timeouts": self.hb_timeouts.to_dict(),
            "section_timeouts": self.section_timeouts.to_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore timeouts saved by :meth:`state_dict`, before or after init.

        Only calculated timeouts are restored (configured ones come from the config). After
        init they are sent to the monitor at once; before init, at init.

        Raises:
            RankMonitorClientError: The state has the wrong schema (the message names the key).
        """
        try:
            if not isinstance(state, dict):
                raise ValueError(f"state must be a dict, got {type(state).__name__}")
            version = state.get("version", STATE_DICT_VERSION)
            if version != STATE_DICT_VERSION:
                raise ValueError(f"unsupported state version {version!r}")
            hb = HeartbeatTimeouts.from_dict(state.get("hb_timeouts", {}))
            sections = SectionTimeouts.from_dict(state.get("section_timeouts", {}))
        except ValueError as err:
            raise RankMonitorClientError(f"invalid fault tolerance state: {err}") from None
        parsed = {"hb": hb, "sections": sections}
        if self.is_initialized:
            self._apply_state(parsed)
        else:
            self._loaded_state = parsed

    def _apply_state(self, parsed: dict[str, Any]) -> None:
        hb: HeartbeatTimeouts = parsed["hb"]
        sections: SectionTimeouts = parsed["sections"]
        if hb.were_calculated:
            self.hb_timeouts = hb
            self._send_hb_timeouts()
        calculated = [s for s in sections.calculated_sections if s in self._section_offsets]
        if calculated or sections.is_out_of_section_calculated:
            current = self.section_timeouts
            merged = dict(current.section)
            for name in calculated:
                merged[name] = sections.section.get(name)
            self.section_timeouts = SectionTimeouts(
                section=merged,
                out_of_section=(sections.out_of_section if sections.is_out_of_section_calculated
                                else current.out_of_section),
                calculated_sections=calculated,
                is_out_of_section_calculated=sections.is_out_of_section_calculated,
            )
            self._send_section_timeouts()

    # ------------------------------------------------------------------ workload control

    def send_workload_control_request(self, req: WorkloadControlRequest) -> None:
        """Ask the launcher to change how it handles the workload (see ``WorkloadAction``).

        The request goes to the launcher's control socket (``FT_LAUNCHER_IPC_SOCKET``) and is
        acknowledged before this returns. It does not need an initialised client.

        Raises:
            RankMonitorClientError: Not started by ``ft_launcher``, or the launcher did not
                acknowledge the request.
        """
        if not isinstance(req, WorkloadControlRequest):
            raise RankMonitorClientError(
                f"expected a WorkloadControlRequest, got {type(req).__name__}"
            )
        path = os.environ.get(FT_LAUNCHER_IPC_SOCKET_ENV_VAR)
        if not path:
            raise RankMonitorClientError(
                f"{FT_LAUNCHER_IPC_SOCKET_ENV_VAR} is not set: workload control requests need a "
                "rank started by ft_launcher"
            )
        sender = self.rank_info or _rank_info_from_env()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(REPLY_TIMEOUT)
                sock.connect(path)
                protocol.send_message(sock, {
                    "type": protocol.MSG_WORKLOAD_CONTROL, **req.to_dict(), **sender,
                })
                reply = protocol.recv_message(sock, REPLY_TIMEOUT)
        except (OSError, ProtocolError, TimeoutError) as err:
            raise RankMonitorClientError(
                f"could not deliver {req.action.name} to the launcher at {path}: {err}"
            ) from None
        if reply["type"] != protocol.MSG_OK:
            raise RankMonitorClientError(
                f"the launcher rejected {req.action.name}: {reply.get('error', reply['type'])}"
            )
        logger.info("rank %s: sent workload control request %s (%s)",
                    self.rank_info.get("rank"), req.action.name, req.description)


def _rank_info_from_env() -> dict[str, Any]:
    info: dict[str, Any] = {"hostname": socket.gethostname()}
    for key, env_name in (("rank", "RANK"), ("local_rank", "LOCAL_RANK"), ("world_size", "WORLD_SIZE")):
        value = os.environ.get(env_name, "").strip()
        if re.fullmatch(r"-?[0-9]{1,9}", value):  # str.isdigit would also accept e.g. "²"
            info[key] = int(value)
    return info
