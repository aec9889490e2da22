"""The run directory and its files as only this user can have made them.

``scripts/autoresume.sh`` trusts what it finds in its run directory: the state, ``history.tsv``,
the finished flag. Another user must not be able to fool it (a planted flag ends the loop
without training; a ``history.tsv`` that is a symbolic link makes the loop, run by root, append
to any file) nor block it (a lock file they can open, they can lock). So:

- the run directory must belong to this user, and others may not write to it, nor its group
  unless the directory is sticky (``chmod +t``, e.g. a 3770 project directory): then no one
  else (root aside) can rename or remove an entry in it, and a path in it names what this user
  put there (an entry a colleague adds in a sticky group directory is theirs, and refused below);
- no file the loop uses there, and no finished flag wherever it is, may be a symbolic link or
  belong to another user (it was planted, or left from a time when the directory was open);
- the loop's files are opened with ``O_NOFOLLOW`` and checked once open, and created with
  ``O_EXCL``;
- the lock file is 0600: no other user can open it, so no other user can lock it.

A path that breaks a rule raises :class:`ForeignFileError`, whose message names the path, says
why, and what to do. Standard library only (it runs between attempts).
"""

from __future__ import annotations

import errno
import os
import stat

LOCK_NAME = ".lock"
"""The run directory's lock file (``flock``, held by the script and its launchers)."""
RUN_DIR_FILES = (LOCK_NAME, "state", "history.tsv", "node_history.tsv", "excluded_nodes", "nodes",
                 "finished.flag", "ft_events.jsonl", "ft_events.jsonl.lock")
"""The entries of the run directory the loop and its launchers use (``nodes`` is a directory)."""
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


class ForeignFileError(PermissionError):
    """A path another user made or could change; the message says which, why, and what to do."""


def _foreign(path: str, info: os.stat_result) -> ForeignFileError:
    return ForeignFileError(f"{path} belongs to uid {info.st_uid}, not to this user (uid {os.getuid()}): "
                            "another user made it, and the auto-resume loop trusts only its own files; "
                            "remove it, or use another --run-dir")


def _link(path: str) -> ForeignFileError:
    return ForeignFileError(f"{path} is a symbolic link: the auto-resume loop follows none among its "
                            "files (another user could have made it point anywhere); remove it")


MAX_LINKS = 40
"""The most symbolic links followed on one path (the kernel's own limit, ``ELOOP``)."""


def check_path_links(path: str) -> None:
    """Check that no symbolic link on the way to ``path`` belongs to another user (root aside).

    A link in a directory open to others (``/scratch/run -> /etc``) would otherwise take the
    loop, and what it creates, wherever its owner likes. Every link is resolved one at a time,
    as the kernel does, and each one met - in ``path`` itself or in the target of a link
    followed before - must be this user's or root's: a link of this user that leads through a
    colleague's link is refused as that link is. The part of the path that does not exist yet is
    not examined.

    Raises:
        ForeignFileError: Such a link, with its path (and the link that led to it), or more than
            :data:`MAX_LINKS` links on the way (a loop).
    """
    # the parts still to walk, the next one last; relative paths start at the working directory
    todo = list(reversed(os.path.join(os.getcwd(), path).split(os.sep)))
    current, followed = os.sep, []
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":  # of the directory reached, as the kernel does: after a link, its target's parent
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, part)
        try:
            info = os.lstat(candidate)
        except (FileNotFoundError, NotADirectoryError):
            return
        if not stat.S_ISLNK(info.st_mode):
            current = candidate
            continue
        via = f" (reached through {' -> '.join(followed)})" if followed else ""
        if info.st_uid not in (os.getuid(), 0):
            raise ForeignFileError(f"{candidate}{via} (on the way to {path}) is a symbolic link of uid "
                                   f"{info.st_uid}, not of this user (uid {os.getuid()}): its owner "
                                   "decides where it leads; use a path without it")
        followed.append(candidate)
        if len(followed) > MAX_LINKS:
            raise ForeignFileError(f"more than {MAX_LINKS} symbolic links on the way to {path} (a loop?): "
                                   "use a path without them")
        target = os.readlink(candidate)
        if os.path.isabs(target):
            current = os.sep
        todo.extend(reversed(target.split(os.sep)))


def check_run_dir(path: str) -> None:
    """Check that ``path`` is a directory of this user that no one else may write to.

    Raises:
        ForeignFileError: It is not; the message says why and what to do.
        OSError: It cannot be examined.
    """
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise _link(path)
    if not stat.S_ISDIR(info.st_mode):
        raise ForeignFileError(f"run dir {path} is not a directory")
    if info.st_uid != os.getuid():
        raise ForeignFileError(f"run dir {path} belongs to uid {info.st_uid}, not to this user "
                               f"(uid {os.getuid()}): its owner could plant or change the loop's files "
                               "in it; use a directory of your own as --run-dir")
    mode = stat.S_IMODE(info.st_mode)
    # With the sticky bit, the group may add entries but not rename or remove those of this user:
    # a name the loop made keeps naming what it made, and an entry a colleague adds under one of
    # the loop's names belongs to them and is refused where it is read (check_entry, open_own).
    # Others' write stays refused, sticky or not: anyone on the machine could take those names.
    if mode & 0o002 or (mode & 0o020 and not mode & stat.S_ISVTX):
        who = "others" if mode & 0o002 else "its group"
        raise ForeignFileError(f"run dir {path} (mode {mode:o}) is writable by {who}: another user could "
                               f"plant or replace the loop's files in it; run 'chmod go-w {path}' (or, for a "
                               "group directory, 'chmod +t') or use another --run-dir")


def check_entry(path: str) -> os.stat_result | None:
    """The entry at ``path`` if it is this user's and no symbolic link; None if there is none.

    Raises:
        ForeignFileError: It is a symbolic link, or belongs to another user.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        raise _link(path)
    if info.st_uid != os.getuid():
        raise _foreign(path, info)
    return info


def own_file_exists(path: str) -> bool:
    """Whether this user's file is at ``path`` (the finished flag: only the ranks make it).

    Raises:
        ForeignFileError: Something is there that another user could have planted.
    """
    return check_entry(path) is not None


def check_run_dir_files(run_dir: str) -> None:
    """Check every entry of :data:`RUN_DIR_FILES` in ``run_dir`` (see :func:`check_entry`)."""
    for name in RUN_DIR_FILES:
        check_entry(os.path.join(run_dir, name))


def _checked(fd: int, path: str) -> int:
    """``fd`` if it is a regular file of this user, else closed and refused."""
    info = os.fstat(fd)
    if info.st_uid != os.getuid() or not stat.S_ISREG(info.st_mode):
        os.close(fd)
        if info.st_uid != os.getuid():
            raise _foreign(path, info)
        raise ForeignFileError(f"{path} is not a regular file")
    return fd


def open_own(path: str, flags: int, mode: int = 0o666) -> int:
    """Open this user's file ``path`` (a descriptor), never through a symbolic link.

    With ``os.O_CREAT`` in ``flags`` a missing file is created with ``O_EXCL``, so what is
    opened is either the new file or one that was already there, and the latter is checked.

    Raises:
        ForeignFileError: A symbolic link, another user's file, or not a regular file.
        OSError: As ``os.open``.
    """
    create = flags & os.O_CREAT
    flags &= ~(os.O_CREAT | os.O_EXCL)
    for _ in range(10):   # bounded: each round loses only to a file removed or made meanwhile
        if create:
            try:
                return os.open(path, flags | os.O_CREAT | os.O_EXCL | _NOFOLLOW, mode)
            except FileExistsError:
                pass
        try:
            return _checked(os.open(path, flags | _NOFOLLOW), path)
        except FileNotFoundError:
            if not create:
                raise
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise _link(path) from None
            raise
    raise OSError(errno.EAGAIN, f"{path} keeps appearing and disappearing")


def read_own(path: str) -> str | None:
    """The text of this user's file ``path``; None if there is none.

    Raises:
        ForeignFileError: See :func:`open_own`.
        OSError: It cannot be read.
    """
    try:
        fd = open_own(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, encoding="utf-8", errors="replace") as src:
        return src.read()


def prepare_lock_file(path: str) -> None:
    """Make sure the lock file ``path`` exists, is this user's and is 0600.

    Only a user who can open a file can lock it: with 0600, no other user can hold the run
    directory's lock and so keep the loop out. A lock file of this user with a wider mode (made
    by an older version) is narrowed.

    Raises:
        ForeignFileError: See :func:`open_own`.
    """
    fd = open_own(path, os.O_RDONLY | os.O_CREAT, 0o600)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != 0o600:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
