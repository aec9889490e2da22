"""launcher.resume.own_files: what another user made, or could change, is refused (issue 21 item 8).

Real files, some given to ``nobody`` with chown (the tests run as root, as the other-uid tests do).
The whole script against planted run directories is tests/integration/test_autoresume_local.py.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from launcher.resume import history, own_files
from launcher.resume.own_files import ForeignFileError

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="gives files to another user (chown)")


def test_a_link_of_another_user_on_the_way_is_refused_ones_own_are_followed(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "mine").symlink_to(target)
    own_files.check_path_links(str(tmp_path / "mine" / "run" / "deeper"))  # the missing part is not examined
    (tmp_path / "theirs").symlink_to(target)
    os.lchown(tmp_path / "theirs", NOBODY, NOBODY)
    with pytest.raises(ForeignFileError, match=f"theirs .*symbolic link of uid {NOBODY}"):
        own_files.check_path_links(str(tmp_path / "theirs" / "run"))


# Links on the way to a run dir: (link, its owner, its target), then the path checked and the link
# the refusal must name (None: accepted). "tmp" is the test's directory; every link is resolved, a
# link met inside another link's target counts as one in the path itself.
LINK_CASES = {
    "own link": ([("mine", 0, "{tmp}/target")], "mine/run", None),
    "colleague's link": ([("theirs", NOBODY, "{tmp}/target")], "theirs/run", "theirs"),
    "own link through a colleague's": ([("theirs", NOBODY, "{tmp}/target"), ("mine", 0, "{tmp}/theirs")],
                                       "mine/run", "theirs"),
    "own link through a colleague's, relative": ([("theirs", NOBODY, "target"), ("mine", 0, "theirs/sub")],
                                                 "mine/run", "theirs"),
    "own link through a colleague's deeper down": ([("theirs", NOBODY, "{tmp}/target"), ("mine", 0, "theirs")],
                                                   "mine/sub/run", "theirs"),
    "root's link to own link": ([("mine", 0, "{tmp}/target"), ("roots", 0, "mine")], "roots/run", None),
    "own link to a colleague's dir link via ..": ([("theirs", NOBODY, "{tmp}/target"),
                                                   ("mine", 0, "{tmp}/target/sub/../../theirs")], "mine/run",
                                                  "theirs"),
    "a dangling own link": ([("mine", 0, "{tmp}/missing/deeper")], "mine/run", None),
    "a loop": ([("a", 0, "b"), ("b", 0, "a")], "a/run", "more than 40 symbolic links"),
}


@pytest.mark.parametrize("case", LINK_CASES)
def test_every_link_on_the_way_is_resolved_and_each_must_be_ours_or_roots(tmp_path: Path, case: str) -> None:
    links, checked, refused = LINK_CASES[case]
    (tmp_path / "target" / "sub").mkdir(parents=True)
    for name, owner, target in links:
        (tmp_path / name).symlink_to(target.format(tmp=tmp_path))
        os.lchown(tmp_path / name, owner, owner)
    if refused is None:
        own_files.check_path_links(str(tmp_path / checked))
    else:
        with pytest.raises(ForeignFileError, match=refused):
            own_files.check_path_links(str(tmp_path / checked))


def test_a_relative_path_is_walked_from_the_working_directory(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "target").mkdir()
    (tmp_path / "theirs").symlink_to(tmp_path / "target")
    os.lchown(tmp_path / "theirs", NOBODY, NOBODY)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ForeignFileError, match="theirs"):
        own_files.check_path_links("theirs/run")


@pytest.mark.parametrize(("mode", "owner", "message"), [
    (0o755, 0, None),
    (0o700, 0, None),
    (0o755, NOBODY, f"belongs to uid {NOBODY}"),
    (0o775, 0, "mode 775.* writable by its group"),
    (0o1777, 0, "writable by others"),
    (0o3770, 0, None),  # a sticky group dir: the group adds entries, but cannot rename or remove ours
    (0o1770, 0, None),
    (0o2770, 0, "mode 2770.* writable by its group"),
    (0o3777, 0, "writable by others"),
])
def test_the_run_dir_must_be_ours_and_closed_to_other_writers(tmp_path: Path, mode: int, owner: int,
                                                               message: str | None) -> None:
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(mode)
    os.chown(run, owner, owner)
    if message is None:
        own_files.check_run_dir(str(run))
    else:
        with pytest.raises(ForeignFileError, match=message):
            own_files.check_run_dir(str(run))


def test_planted_entries_are_refused_wherever_they_are_read_or_written(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    (tmp_path / "history.tsv").symlink_to(secret)
    (tmp_path / "state").write_text("attempt=999\n")
    os.chown(tmp_path / "state", NOBODY, NOBODY)
    with pytest.raises(ForeignFileError, match="history.tsv is a symbolic link"):
        history.append_history(str(tmp_path), "1\tlocal\t-\t-\t0\tno\t0", "finished")
    with pytest.raises(ForeignFileError, match="history.tsv is a symbolic link"):
        history.read_history(str(tmp_path))
    with pytest.raises(ForeignFileError, match=f"state belongs to uid {NOBODY}"):
        history.read_state(str(tmp_path))
    with pytest.raises(ForeignFileError):
        own_files.check_run_dir_files(str(tmp_path))
    assert secret.read_text() == "root only\n"
    flag = tmp_path / "finished.flag"
    assert not own_files.own_file_exists(str(flag))
    flag.write_text("done\n")
    assert own_files.own_file_exists(str(flag))
    os.chown(flag, NOBODY, NOBODY)
    with pytest.raises(ForeignFileError, match=f"finished.flag belongs to uid {NOBODY}"):
        own_files.own_file_exists(str(flag))


def test_the_state_is_never_written_through_a_planted_temporary_name(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    (tmp_path / f"state.{os.getpid()}.tmp").symlink_to(secret)
    history.write_state(str(tmp_path), history.State(attempt=3))
    assert secret.read_text() == "root only\n"
    assert history.read_state(str(tmp_path)).attempt == 3


def test_the_lock_file_is_made_0600_and_an_older_wider_one_is_narrowed(tmp_path: Path) -> None:
    lock = tmp_path / ".lock"
    own_files.prepare_lock_file(str(lock))
    assert stat.S_IMODE(lock.stat().st_mode) == 0o600
    lock.chmod(0o644)
    own_files.prepare_lock_file(str(lock))
    assert stat.S_IMODE(lock.stat().st_mode) == 0o600
    os.chown(lock, NOBODY, NOBODY)
    with pytest.raises(ForeignFileError, match=f"belongs to uid {NOBODY}"):
        own_files.prepare_lock_file(str(lock))
