"""launcher.resume.repeats: failures that repeat across attempts, a bad node or a bug.

The rules table by table, then the ``decide`` step over several attempts in slurm mode (node
reports and launcher result files as the node tasks leave them, a fake ``sinfo``).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from launcher import exit_codes
from launcher.resume import __main__ as cli
from launcher.resume import history, options, policy, repeats
from launcher.resume.repeats import CLEAN, EXCLUDED, EXPIRED, FAILED, PROGRESS, ROOT, STOPPED, Event, Rules

FP_A, FP_B = "aaaaaaaaaaaa", "0123456789ab"

# ---------------------------------------------------------------------------- the result file

RESULT_ROWS = [
    ("an older launcher: no fingerprint", "exit_code=1\noutcome=failed\nroot_nodes=h1\n",
     repeats.LauncherResult(("h1",))),
    ("fingerprint and its text", f"root_nodes=h1\nfingerprint={FP_B}\nfingerprint_text=crash  ValueError: x\n",
     repeats.LauncherResult(("h1",), FP_B, "crash ValueError: x")),
    ("empty fingerprint: none", "fingerprint=\nfingerprint_text=x\n", repeats.LauncherResult()),
    ("not 12 hex digits: ignored", "fingerprint=0123456789abc\n", repeats.LauncherResult()),
    ("upper case is the same fingerprint", "fingerprint=AAAAAAAAAAAA\n", repeats.LauncherResult((), FP_A, "")),
    ("the text is cut at 200 characters", f"fingerprint={FP_A}\nfingerprint_text={'y' * 300}\n",
     repeats.LauncherResult((), FP_A, "y" * 200)),
]


@pytest.mark.parametrize(("text", "expected"), [row[1:] for row in RESULT_ROWS],
                         ids=[row[0] for row in RESULT_ROWS])
def test_parse_launcher_result(text: str, expected: repeats.LauncherResult) -> None:
    assert repeats.parse_launcher_result(text) == expected


def test_the_fingerprint_most_nodes_report_stands() -> None:
    reports = [policy.NodeReport("n1", 1, host="n1", fingerprint=FP_A, fingerprint_text="a"),
               policy.NodeReport("n2", 1, host="n2", fingerprint=FP_B, fingerprint_text="b"),
               policy.NodeReport("n3", 1, host="n3", fingerprint=FP_B, fingerprint_text="b"), None]
    out = policy.nodes_outcome(reports, ["n1", "n2", "n3", "n4"], 1)
    assert (out.fingerprint, out.fingerprint_text) == (FP_B, "b")


@pytest.mark.parametrize(("codes", "rc"), [([1, 66, 137], 66), ([66, 64], 64), ([2, 66], 2), ([0, 66], 66)])
def test_exit_66_on_any_node_is_the_attempts_code(codes: list[int], rc: int) -> None:
    assert policy.combine_codes(codes) == rc


# ---------------------------------------------------------------------------- the rules


def failed(attempt: int, fingerprint: str = "-", *roots: str) -> list[Event]:
    return [Event(attempt, "-", FAILED, fingerprint), *(Event(attempt, r, ROOT, fingerprint) for r in roots)]


SLURM = Rules(can_exclude=True)
REPEAT_ROWS = [
    # (name, events, fingerprint, rules) -> (attempts of the repeat, its nodes, a bug?)
    ("once is no repeat", failed(1, FP_A, "n1"), FP_A, SLURM, ((1,), ("n1",), False)),
    ("twice on two nodes: a bug", failed(1, FP_A, "n1") + failed(2, FP_A, "n2"), FP_A, SLURM,
     ((1, 2), ("n1", "n2"), True)),
    ("twice on one node: the node, not a bug", failed(1, FP_A, "n1") + failed(2, FP_A, "n1"), FP_A, SLURM,
     ((1, 2), ("n1",), False)),
    ("twice on one node, local mode: a bug", failed(1, FP_A, "h") + failed(2, FP_A, "h"), FP_A, Rules(),
     ((1, 2), ("h",), True)),
    ("no root known: a bug", failed(1, FP_A) + failed(2, FP_A), FP_A, SLURM, ((1, 2), (), True)),
    ("another fingerprint between does not break the run",
     failed(1, FP_A, "n1") + failed(2, FP_B, "n3") + failed(3, FP_A, "n2"), FP_A, SLURM,
     ((1, 3), ("n1", "n2"), True)),
    ("a clean attempt between starts afresh",
     [*failed(1, FP_A, "n1"), Event(2, "-", CLEAN), *failed(3, FP_A, "n2")], FP_A, SLURM,
     ((3,), ("n2",), False)),
    ("a stop between starts afresh (a resubmission)",
     [*failed(1, FP_A, "n1"), Event(1, "-", STOPPED), *failed(2, FP_A, "n2")], FP_A, SLURM,
     ((2,), ("n2",), False)),
    ("a failed attempt that made progress starts afresh, itself included",
     [*failed(1, FP_A, "n1"), *failed(2, FP_A, "n2"), Event(2, "-", PROGRESS)], FP_A, SLURM,
     ((2,), ("n2",), False)),
    ("--max-repeats 3: not yet", failed(1, FP_A, "n1") + failed(2, FP_A, "n2"), FP_A,
     Rules(max_repeats=3, can_exclude=True), ((1, 2), ("n1", "n2"), False)),
    ("--max-repeats 0: never", failed(1, FP_A) + failed(2, FP_A), FP_A, Rules(max_repeats=0),
     ((1, 2), (), False)),
]


@pytest.mark.parametrize(("events", "fingerprint", "rules", "expected"), [row[1:] for row in REPEAT_ROWS],
                         ids=[row[0] for row in REPEAT_ROWS])
def test_repeats(events: list[Event], fingerprint: str, rules: Rules, expected: tuple) -> None:
    repeat = repeats.repeat_of(events, fingerprint)
    assert repeat is not None
    assert (repeat.attempts, repeat.nodes, repeats.is_bug(repeat, rules)) == expected


def test_no_fingerprint_never_repeats() -> None:
    events = failed(1, "-", "n1") + failed(2, "-", "n2")
    assert repeats.repeat_of(events, "") is None and repeats.repeat_of(events, "-") is None
    assert not repeats.is_bug(None, SLURM)


def test_describe_names_the_fingerprint_its_text_attempts_and_nodes() -> None:
    events = [Event(1, "-", FAILED, FP_A, "crash ValueError: bad"), Event(1, "n1", ROOT, FP_A),
              Event(2, "-", FAILED, FP_A, "crash ValueError: bad"), Event(2, "n2", ROOT, FP_A)]
    assert repeats.describe(repeats.repeat_of(events, FP_A)) == \
        f"fingerprint {FP_A} (crash ValueError: bad) ended attempts 1,2 (root nodes n1,n2)"


BAD_ROWS = [
    # (name, events, fingerprint, rules) -> nodes to exclude
    ("root once: not yet", failed(1, FP_A, "n1"), FP_A, SLURM, []),
    ("root in two attempts, two failures", failed(1, FP_A, "n1") + failed(2, FP_B, "n1"), FP_B, SLURM,
     [("n1", "root of failures in 2 attempts (1,2)")]),
    ("--node-failures-to-exclude 1: at once", failed(1, FP_A, "n1"), FP_A,
     Rules(node_failures_to_exclude=1, can_exclude=True), [("n1", "root of failures in 1 attempts (1)")]),
    ("one fingerprint on one node only, --node-failures-to-exclude 3",
     failed(1, FP_A, "n1") + failed(2, FP_A, "n1"), FP_A, Rules(node_failures_to_exclude=3, can_exclude=True),
     [("n1", f"fingerprint {FP_A} repeated on this node only (attempts 1,2)")]),
    ("roots before the node came back do not count",
     [*failed(1, FP_A, "n1"), Event(1, "n1", EXCLUDED), Event(5, "n1", EXPIRED), *failed(6, FP_B, "n1")],
     FP_B, SLURM, []),
    ("local mode never excludes", failed(1, FP_A, "h") + failed(2, FP_B, "h"), FP_B, Rules(), []),
]


@pytest.mark.parametrize(("events", "fingerprint", "rules", "expected"), [row[1:] for row in BAD_ROWS],
                         ids=[row[0] for row in BAD_ROWS])
def test_bad_nodes(events: list[Event], fingerprint: str, rules: Rules, expected: list) -> None:
    assert repeats.bad_nodes(events, fingerprint, rules) == expected


def clean(*attempts: int) -> list[Event]:
    return [Event(a, "-", CLEAN) for a in attempts]


EXPIRY_ROWS = [
    ("3 clean attempts since: back", [Event(1, "n1", EXCLUDED), *clean(2, 3, 4)], ["n1"], 3, ["n1"]),
    ("2 clean attempts: still out", [Event(1, "n1", EXCLUDED), *clean(2, 3), *failed(4)], ["n1"], 3, []),
    ("failures between do not reset the count",
     [Event(1, "n1", EXCLUDED), *clean(2), *failed(3), *clean(4, 5)], ["n1"], 3, ["n1"]),
    ("counted from its newest exclusion", [Event(1, "n1", EXCLUDED), *clean(2, 3), Event(4, "n1", EXCLUDED),
                                           *clean(5)], ["n1"], 2, []),
    ("excluded before the history began: counts from its start", clean(1, 2, 3), ["old"], 3, ["old"]),
    ("expiry 0: never", [Event(1, "n1", EXCLUDED), *clean(*range(2, 30))], ["n1"], 0, []),
]


@pytest.mark.parametrize(("events", "excluded", "expiry", "expected"), [row[1:] for row in EXPIRY_ROWS],
                         ids=[row[0] for row in EXPIRY_ROWS])
def test_expired_nodes(events: list[Event], excluded: list[str], expiry: int, expected: list[str]) -> None:
    assert repeats.expired_nodes(events, excluded, expiry) == expected


def test_node_history_round_trip_and_forgiving_reader(tmp_path: Path) -> None:
    events = [Event(1, "-", FAILED, FP_A, "crash\tValueError:\nx"), Event(1, "n1", ROOT, FP_A, "crash")]
    history.append_node_history(str(tmp_path), events)
    with open(tmp_path / history.NODE_HISTORY, "a") as out:   # cut short; foreign values
        out.write("2\tn1\troot\n3\t$(rm)\troot\t-\tx\n4\tn1\tnope\t-\tx\n5\tn1\troot\tNOTHEX\tx\n")
    history.append_node_history(str(tmp_path), [Event(6, "-", CLEAN)])
    text = (tmp_path / history.NODE_HISTORY).read_text()
    assert text.startswith("attempt\tnode\tevent\tfingerprint\tdetail\n") and text.count("attempt\t") == 1
    assert history.read_node_history(str(tmp_path)) == [
        Event(1, "-", FAILED, FP_A, "crash ValueError: x"), Event(1, "n1", ROOT, FP_A, "crash"),
        Event(6, "-", CLEAN)]


# ---------------------------------------------------------------------------- decide, slurm mode


class SlurmSteps:
    """The ``start`` and ``decide`` steps of one slurm-mode run dir, attempt after attempt."""

    def __init__(self, tmp_path: Path, capsys: pytest.CaptureFixture, **changes: object) -> None:
        self.run = tmp_path / "run"
        self.run.mkdir()
        self.capsys = capsys
        values = {"mode": "slurm", "job_id": "17", "job_ref": "17", "hosts": "n1,n2", "nnodes": 2,
                  **changes}
        self.settings = cli.settings_from({k: str(v) for k, v in cli.Settings(
            run_dir=str(self.run), flag_file=str(self.run / "finished.flag"), **values).__dict__.items()})
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "sinfo").write_text("#!/bin/sh\nprintf 'n1\\nn2\\nn3\\nn4\\nn5\\n'\n")
        (bin_dir / "sinfo").chmod(0o755)
        self.env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}

    def attempt(self, codes: dict[str, int], root: str = "", fingerprint: str = "") -> dict[str, str]:
        """One attempt on the nodes of ``codes`` (name: launcher exit code); its decision."""
        self.capsys.readouterr()
        cli.step_start(self.settings)
        results = self.run / "nodes"
        results.mkdir()
        for index, (node, code) in enumerate(codes.items()):
            (results / f"node.{index}").write_text(f"{node} {code} - - {node}\n")
            if code:
                (results / f"launcher.{index}").write_text(
                    f"exit_code={code}\noutcome=failed\nroot_nodes={root}\nfingerprint={fingerprint}\n"
                    "fingerprint_text=crash ValueError: bad batch\n")
        self.capsys.readouterr()
        cli.step_decide(self.settings, {"srun_rc": str(max(codes.values())), "results": str(results)},
                        self.env)
        out = {}
        for line in self.capsys.readouterr().out.splitlines():
            name, _, value = line.partition("=")
            out[name] = shlex.split(value)[0] if value else ""
        return out


def test_a_node_that_is_the_root_twice_is_excluded_and_comes_back_after_clean_attempts(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    steps = SlurmSteps(tmp_path, capsys)
    out = steps.attempt({"n1": 1, "n2": 1}, root="n1", fingerprint=FP_A)
    assert (out["VERDICT"], out["EXCLUDE_UPDATE"]) == ("continue", "")   # once: not yet
    out = steps.attempt({"n1": 1, "n3": 1}, root="n1", fingerprint=FP_B)
    assert (out["VERDICT"], out["EXCLUDE_UPDATE"], out["EXCLUDE_LIST"]) == ("continue", "1", "n1")
    assert out["DECISION_REQUEUED"].endswith("job 17 requeued excluding n1")
    assert history.read_excluded(str(steps.run)) == ["n1"]
    for _ in range(2):
        out = steps.attempt({"n2": 0, "n3": 0})
        assert (out["VERDICT"], out["EXCLUDE_UPDATE"], out["EXCLUDE_LIST"]) == ("continue", "1", "n1")
    out = steps.attempt({"n2": 0, "n3": 0})   # the third clean attempt: n1 may come back
    assert (out["VERDICT"], out["EXCLUDE_UPDATE"], out["EXCLUDE_LIST"]) == ("continue", "1", "")
    assert history.read_excluded(str(steps.run)) == []
    kinds = [(e.attempt, e.node, e.kind) for e in history.read_node_history(str(steps.run)) if e.node != "-"]
    assert kinds == [(1, "n1", ROOT), (2, "n1", ROOT), (2, "n1", EXCLUDED), (5, "n1", EXPIRED)]


def test_the_same_fingerprint_on_two_nodes_stops_with_66(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    steps = SlurmSteps(tmp_path, capsys, max_failures=10)
    assert steps.attempt({"n1": 1, "n2": 1}, root="n1", fingerprint=FP_A)["VERDICT"] == "continue"
    out = steps.attempt({"n2": 1, "n3": 1}, root="n2", fingerprint=FP_A)
    assert (out["VERDICT"], out["SCRIPT_RC"]) == ("stop", str(exit_codes.EXIT_REPEATED_FAILURE))
    assert out["DECISION"] == (f"stop: a repeating failure, a bug and not a node: fingerprint {FP_A} "
                               "(crash ValueError: bad batch) ended attempts 1,2 (root nodes n1,n2); "
                               "not requeued (ft_launcher exit 1)")
    # A resubmission of the stopped run counts afresh.
    assert steps.attempt({"n1": 1, "n3": 1}, root="n3", fingerprint=FP_A)["VERDICT"] == "continue"


def test_the_same_fingerprint_on_one_node_excludes_it(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    steps = SlurmSteps(tmp_path, capsys, node_failures_to_exclude=3, max_failures=10)
    assert steps.attempt({"n1": 1, "n2": 1}, root="n1", fingerprint=FP_A)["EXCLUDE_UPDATE"] == ""
    with caplog.at_level("INFO", logger="launcher.resume"):
        out = steps.attempt({"n1": 1, "n2": 1}, root="n1", fingerprint=FP_A)
    assert (out["VERDICT"], out["EXCLUDE_LIST"]) == ("continue", "n1")
    assert f"attempt 2: excluding node n1: fingerprint {FP_A} repeated on this node only (attempts 1,2)" \
        in caplog.messages
    # The same failure once more, on another node: now it is a bug.
    out = steps.attempt({"n2": 1, "n3": 1}, root="n2", fingerprint=FP_A)
    assert (out["VERDICT"], out["SCRIPT_RC"]) == ("stop", "66")


def test_launcher_exit_66_stops_without_requeue(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    steps = SlurmSteps(tmp_path, capsys)
    out = steps.attempt({"n1": 66, "n2": 137}, root="n1", fingerprint=FP_A)
    assert (out["VERDICT"], out["SCRIPT_RC"], out["EXCLUDE_UPDATE"]) == ("stop", "66", "")
    assert out["DECISION"].startswith("stop: ft_launcher stopped a repeating failure (exit 66)")


# ---------------------------------------------------------------------------- options

@pytest.mark.parametrize(("args", "env", "message"), [
    (["--max-repeats", "x"], {}, "--max-repeats (AUTORESUME_MAX_REPEATS) must be a whole number <= 1000000 "
                                 "(0 = never stop for a repeat), got 'x'"),
    (["--node-failures-to-exclude=0"], {}, "--node-failures-to-exclude (AUTORESUME_NODE_FAILURES_TO_EXCLUDE) must "
                                           "be a whole number >= 1 and <= 1000000, got '0'"),
    ([], {"AUTORESUME_NODE_EXCLUSION_EXPIRY": "-1"}, "--node-exclusion-expiry (AUTORESUME_NODE_EXCLUSION_EXPIRY) "
                                                     "must be a whole number <= 1000000 (0 = never), got '-1'"),
])
def test_bad_repeat_options_are_usage_errors(args: list[str], env: dict[str, str], message: str) -> None:
    opts = options.parse_args([*args, "train.py"], options.from_environment(env))
    with pytest.raises(options.AutoresumeUsageError) as err:
        options.validate(opts, env)
    assert str(err.value) == message


def test_repeat_options_reach_the_steps(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    env = {"PATH": "/usr/bin:/bin", "AUTORESUME_MAX_REPEATS": "5"}
    assert cli.step_config(["--run-dir", str(tmp_path / "run"), "--launcher", "/bin/true", "--mode", "local",
                            "--node-failures-to-exclude", "1", "--node-exclusion-expiry=0", "train.py"], env) == 0
    policy_args = shlex.split(capsys.readouterr().out.split("POLICY_ARGS=(", 1)[1].split(")\n", 1)[0])
    settings = cli.settings_from(cli.parse_step_args(policy_args))
    assert (settings.max_repeats, settings.node_failures_to_exclude, settings.node_exclusion_expiry) == (5, 1, 0)
    assert settings.rules == Rules(5, 1, 0, can_exclude=False)
