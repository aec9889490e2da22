"""The file that carries calculated timeouts from one run to the next.

Rank 0 of a run that calculated timeouts writes the client's ``state_dict()`` to
``<directory>/_ft_state.json``; the next run (a restart or a resumed job) reads it at setup and
starts with those timeouts. One module for every front end:

* **Read**: rank 0 reads the file (at most :data:`MAX_STATE_FILE_BYTES`, UTF-8, a JSON object)
  and broadcasts the text through a :class:`~ft_core.client.collectives.Collectives`, so every rank
  starts from the same timeouts even when the file is on a node-local disk. A file that cannot
  be used is one WARNING and "configured timeouts are used", never an error.
* **Parts**: a heartbeat front end uses only the file's ``hb_timeouts``, a sections front end
  only its ``section_timeouts``. Runs of both kinds may share a directory (a job that switches
  callbacks, two jobs with one ``exp_dir``): neither applies the other's timeouts (a calculated
  out-of-section timeout would stop a heartbeat run that opens no section), and neither wipes
  them.
* **Write**: read-merge-write under a lock (``filelock``, ``<file>.lock`` next to the file), so
  that two processes that update different parts at the same time both keep theirs; the write
  itself is atomic (:mod:`ft_core.wire.atomic`). Where the filesystem cannot lock, the file is
  written without the lock, with a warning. A file that cannot be written is an ERROR line;
  the run goes on with its timeouts.
* **Unusable location**: a directory that is a file, lies under a file, or cannot be written is
  found at set-up, when rank 0 would read the file: one WARNING names what is wrong and how to fix
  it; the file is then neither read nor written (no second warning, no error at every save), and
  the run goes on with the timeouts it calculates, for itself only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any, Optional, Protocol, Union

from ft_core.client.collectives import Collectives
from ft_core.client.state import HB_TIMEOUTS_KEY, SECTION_TIMEOUTS_KEY
from ft_core.wire.atomic import atomic_write_text
from ft_core.wire.errors import RankMonitorClientError

STATE_FILE_NAME = "_ft_state.json"
"""The file's name in its directory."""

MAX_STATE_FILE_BYTES = 1 << 20
"""A state file is a few hundred bytes; a larger file is not ours and is ignored."""

PART_HEARTBEATS = HB_TIMEOUTS_KEY
PART_SECTIONS = SECTION_TIMEOUTS_KEY
PARTS = (PART_HEARTBEATS, PART_SECTIONS)
"""The keys of ``RankMonitorClient.state_dict()`` that front ends own, one each."""

LOCK_TIMEOUT = 10.0
"""Seconds a writer waits for another to finish before it writes without the lock."""

Logger = Union[logging.Logger, logging.LoggerAdapter]


class StateClient(Protocol):
    """What :meth:`StateFile.restore` needs of a :class:`~ft_core.RankMonitorClient`."""

    def load_state_dict(self, state: dict[str, Any], *, source: Optional[str] = None) -> None: ...


def state_file_path(directory: Union[str, os.PathLike[str]], name: str = STATE_FILE_NAME) -> str:
    """``<directory>/<name>``."""
    return os.path.join(os.fspath(directory), name)


class StateFile:
    """One front end's view of a state file.

    Args:
        path: The file.
        part: :data:`PART_HEARTBEATS` or :data:`PART_SECTIONS`: the timeouts this front end
            reads and writes; the file's other part is kept as it is.
        log: Where problems and saves are reported (a rank-prefixed adapter, typically).

    Raises:
        ValueError: ``part`` is not one of :data:`PARTS`.
    """

    def __init__(self, path: str, part: str, log: Optional[Logger] = None) -> None:
        if part not in PARTS:
            raise ValueError(f"StateFile: part must be one of {', '.join(PARTS)}, got {part!r}")
        self.path = path
        self.part = part
        self.lock_path = path + ".lock"
        self._log = log if log is not None else logging.getLogger(__name__)
        self.unusable: Optional[str] = None
        """Why the file cannot be used, when :meth:`read_agreed` found that at set-up (rank 0)."""

    # ------------------------------------------------------------------ reading

    def restore(self, client: StateClient, collectives: Collectives) -> bool:
        """Load this front end's saved timeouts into ``client`` (before or after its init).

        A collective (see :meth:`read_agreed`): every rank must call it.

        Returns:
            True if timeouts were loaded; False when there were none or they were unusable
            (then one WARNING says why, and the configured timeouts are used).
        """
        state = self.read_agreed(collectives)
        if state is None:
            return False
        try:
            client.load_state_dict(state, source=self.path)  # the in-force line names the file
        except RankMonitorClientError as err:
            self._log.warning("ignoring fault tolerance state file %s: %s; configured timeouts are used",
                              self.path, err)
            return False
        info = getattr(self._log, "rank_zero_info", self._log.info)  # every rank loads the same timeouts
        info("loaded calculated timeouts (%s) from %s", self.part, self.path)
        return True

    def read_agreed(self, collectives: Collectives) -> Optional[dict[str, Any]]:
        """Rank 0 reads the file, every rank gets its text; return this front end's part.

        A collective when the job has a process group: every rank must call it.

        Returns:
            ``{"version": ..., part: ...}`` ready for ``load_state_dict``, or None when the file
            is missing, unusable (a WARNING) or has no timeouts of this part.
        """
        text = self._read_at_setup() if collectives.rank() == 0 else None
        return self.parse(collectives.broadcast_text(text))

    def _read_at_setup(self) -> Optional[str]:
        """:meth:`read_text`, after checking that the file's location can be used at all."""
        self.unusable = unusable_location(self.path)
        if self.unusable is not None:
            # Said once, here, as what it is: later saves are skipped instead of failing each time.
            self._log.warning(
                "fault tolerance state file %s cannot be used: %s. Calculated timeouts cannot be kept "
                "between runs: each run starts from the configured timeouts (and uses what it calculates "
                "itself). Fix: give the front end a writable directory (exp_dir of the Lightning callbacks, "
                "the checkpoint directory of ft_core.client.integration.setup), or set calculate_timeouts=False",
                self.path, self.unusable)
            return None
        return self.read_text()

    def read_text(self) -> Optional[str]:
        """The file's text, or None when it is missing or unusable (then a log line says why)."""
        try:
            with open(self.path, "rb") as stream:
                data = stream.read(MAX_STATE_FILE_BYTES + 1)
        except FileNotFoundError:
            self._log.info("no fault tolerance state file at %s yet", self.path)
            return None
        except OSError as err:
            self._log.warning("cannot read fault tolerance state file %s: %s; configured timeouts are used",
                              self.path, err)
            return None
        if len(data) > MAX_STATE_FILE_BYTES:
            self._log.warning("ignoring fault tolerance state file %s: larger than %s bytes; configured "
                              "timeouts are used", self.path, MAX_STATE_FILE_BYTES)
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as err:
            self._log.warning("ignoring fault tolerance state file %s: not UTF-8 text (%s); configured "
                              "timeouts are used", self.path, err)
            return None

    def parse(self, text: Optional[str]) -> Optional[dict[str, Any]]:
        """This front end's part of the file's ``text`` (see :meth:`read_agreed`)."""
        if text is None:
            return None
        try:
            state = _loads(text)
        except ValueError as err:
            self._log.warning("ignoring fault tolerance state file %s: not valid JSON (%s); configured "
                              "timeouts are used", self.path, err)
            return None
        if not isinstance(state, dict):
            self._log.warning("ignoring fault tolerance state file %s: expected a JSON object, got %s; "
                              "configured timeouts are used", self.path, type(state).__name__)
            return None
        if self.part not in state:
            self._log.info("fault tolerance state file %s has no %s yet", self.path, self.part)
            return None
        mine = {self.part: state[self.part]}
        if "version" in state:
            mine["version"] = state["version"]
        return mine

    # ------------------------------------------------------------------ writing

    def save(self, state: Mapping[str, Any], announce: bool = True) -> bool:
        """Write ``state`` (a client's ``state_dict()``), keeping the file's other part.

        Call it on one rank only (rank 0). Never raises for I/O problems: they are logged.

        Args:
            announce: Log the save at INFO (else DEBUG: the timeouts did not change much).

        Returns:
            True if the file was written (False also when set-up found the file's location unusable
            and it still is: that was the set-up's warning, and nothing is logged above DEBUG).
        """
        if self.unusable is not None:
            self.unusable = unusable_location(self.path)
            if self.unusable is not None:
                self._log.debug("calculated timeouts not saved to %s: %s", self.path, self.unusable)
                return False
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            with self.locked():
                merged = self._merge(state, self._read_for_merge())
                atomic_write_text(self.path, json.dumps(merged, indent=2, sort_keys=True) + "\n")
        except OSError as err:
            # Losing calculated timeouts only means the next run starts from the configured ones.
            self._log.error("cannot save calculated timeouts to %s: %s", self.path, err)
            return False
        self._log.log(logging.INFO if announce else logging.DEBUG, "saved calculated timeouts to %s", self.path)
        return True

    def _merge(self, state: Mapping[str, Any], current: Optional[dict[str, Any]]) -> dict[str, Any]:
        merged = dict(state)
        # Another version's parts may not parse with ours: then ours replaces the file.
        if current is not None and current.get("version") == state.get("version"):
            for key in PARTS:
                if key != self.part and key in current:
                    merged[key] = current[key]
        return merged

    def _read_for_merge(self) -> Optional[dict[str, Any]]:
        """The file's content as an object, or None (missing or unusable: it is replaced)."""
        try:
            with open(self.path, "rb") as stream:
                data = stream.read(MAX_STATE_FILE_BYTES + 1)
        except FileNotFoundError:
            return None
        if len(data) > MAX_STATE_FILE_BYTES:
            return None
        try:
            current = _loads(data.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            return None
        return current if isinstance(current, dict) else None

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the file's lock (:meth:`save` holds it around its read-merge-write).

        Waits up to :data:`LOCK_TIMEOUT` for another holder (an INFO line says so), then goes on
        without the lock, with a warning; so does a filesystem that cannot lock.

        Raises:
            OSError: The lock file cannot be created (e.g. the directory is not writable).
        """
        import filelock  # only the writing rank needs it

        lock = filelock.FileLock(self.lock_path)
        locked = self._acquire(lock, filelock.Timeout)
        try:
            yield
        finally:
            if locked:
                lock.release()

    def _acquire(self, lock: Any, timeout_error: type[Exception]) -> bool:
        try:
            try:
                lock.acquire(timeout=0)
            except timeout_error:
                # The line also tells a test that this writer really waited for another.
                self._log.info("waiting for %s: another process is updating %s", self.lock_path, self.path)
                lock.acquire(timeout=LOCK_TIMEOUT)
        except timeout_error:
            self._log.warning("could not lock %s within %s s; writing %s without the lock",
                              self.lock_path, LOCK_TIMEOUT, self.path)
            return False
        except NotImplementedError as err:  # filelock < 3.13 on a filesystem without flock
            self._log.warning("cannot lock %s (%s); writing %s without the lock", self.lock_path, err, self.path)
            return False
        return True


def unusable_location(path: str) -> Optional[str]:
    """Why a state file at ``path`` could not be written, or None when it can be, as far as
    permissions and file types tell (a full disk shows only when writing).

    Its directory may be missing (:meth:`StateFile.save` creates it): then the nearest existing
    ancestor must be a directory this process can write.
    """
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return f"{path} is a directory"
    existing = directory
    while True:
        try:
            os.lstat(existing)
            break
        except (FileNotFoundError, NotADirectoryError):  # missing, or under a file: look further up
            pass
        except PermissionError:
            return (f"the directory {directory} cannot be reached by this user (uid {os.getuid()}): a "
                    "directory above it cannot be searched")
        except OSError as err:
            return f"{existing}: {err.strerror or err}"
        parent = os.path.dirname(existing)
        if parent == existing:
            break
        existing = parent
    if not os.path.isdir(existing):
        what = "a file" if os.path.isfile(existing) else "not a directory"
        if existing == directory:
            return f"{directory} is {what}, not the directory it should be" if what == "a file" else \
                f"{directory} is not a directory"
        return f"{existing} is {what}, so the directory {directory} cannot be created"
    if not os.access(existing, os.W_OK | os.X_OK):
        if existing == directory:
            return f"the directory {directory} is not writable by this user (uid {os.getuid()})"
        return (f"the directory {directory} does not exist and cannot be created: {existing} is not "
                f"writable by this user (uid {os.getuid()})")
    return None


def _loads(text: str) -> Any:
    """``json.loads(text)``, whose every failure is a ValueError.

    The decoder recurses once per nesting level: a small file of ``[[[[...`` exhausts the
    interpreter's recursion limit, and the RecursionError would escape every caller that treats a
    bad file as "not valid JSON" (a state file is anyone's file on a shared disk).

    Raises:
        ValueError: Not JSON, or JSON nested too deeply to decode.
    """
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply to decode") from None
