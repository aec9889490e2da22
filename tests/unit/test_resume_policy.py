"""launcher.resume: the decisions of scripts/autoresume.sh, table by table."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import exit_codes
from launcher.resume import __main__ as cli
from launcher.resume import history, options, policy
from launcher.resume.policy import Attempt, Limits, NodeReport

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "autoresume.sh"

# ---------------------------------------------------------------------------- the decision table

# (name, attempt, limits) -> (verdict, script exit, decision text, failures shown, carried)
LIMITS = Limits(max_failures=3)
DECIDE_ROWS = [
    ("flag present", Attempt(1, 0, True), LIMITS,
     ("finished", 0, "finished: flag file present", 0, 0)),
    ("flag present, launcher failed", Attempt(1, 1, True, failures=2), LIMITS,
     ("finished", 0, "finished: flag file present (ft_launcher exited 1)", 0, 0)),
    ("flag beats ShutdownWorkload", Attempt(1, 64, True), LIMITS,
     ("finished", 0, "finished: flag file present (ft_launcher exited 64)", 0, 0)),
    ("flag beats a stop signal", Attempt(1, 0, True, terminated="SIGTERM"), LIMITS,
     ("finished", 0, "finished: flag file present", 0, 0)),
    ("ShutdownWorkload", Attempt(1, 64, False, failures=2), LIMITS,
     ("stop", 64, "stop: a rank requested ShutdownWorkload (ft_launcher exit 64)", 2, 0)),
    ("ShutdownWorkload beats a stop signal", Attempt(1, 64, False, terminated="SIGTERM"), LIMITS,
     ("stop", 64, "stop: a rank requested ShutdownWorkload (ft_launcher exit 64)", 0, 0)),
    ("launcher usage error", Attempt(1, 2, False, failures=1), LIMITS,
     ("stop", 2, "stop: ft_launcher usage error (exit 2); fix the command line", 1, 0)),
    ("usage error beats a warning", Attempt(1, 2, False, warned="SIGUSR1"), LIMITS,
     ("stop", 2, "stop: ft_launcher usage error (exit 2); fix the command line", 0, 0)),
    ("launcher stopped a repeating failure", Attempt(1, 66, False, failures=1), LIMITS,
     ("stop", 66, "stop: ft_launcher stopped a repeating failure (exit 66): the same failure ended "
      "its restarts without progress, a requeue will not fix it; not requeued", 1, 0)),
    ("exit 66 beats a warning", Attempt(1, 66, False, warned="SIGUSR1", local=False), LIMITS,
     ("stop", 66, "stop: ft_launcher stopped a repeating failure (exit 66): the same failure ended "
      "its restarts without progress, a requeue will not fix it; not requeued", 0, 0)),
    ("a repeat across attempts stops before --max-failures",
     Attempt(2, 1, False, failures=1, repeated="fingerprint 0123456789ab ended attempts 1,2"), LIMITS,
     ("stop", 66, "stop: a repeating failure, a bug and not a node: fingerprint 0123456789ab ended "
      "attempts 1,2; not requeued (ft_launcher exit 1)", 2, 0)),
    ("a repeat beats no progress",
     Attempt(2, 1, False, failures=1, stalled=1, repeated="x"), Limits(progress_path="/p"),
     ("stop", 66, "stop: a repeating failure, a bug and not a node: x; not requeued (ft_launcher "
      "exit 1)", 2, 0)),
    ("SIGTERM, ranks stopped in time", Attempt(1, 0, False, terminated="SIGTERM"), LIMITS,
     ("stop", 143, "stop: terminated by SIGTERM (ft_launcher exit 0: the ranks stopped in time)",
      0, 0)),
    ("SIGINT, not a clean stop", Attempt(1, 1, False, terminated="SIGINT", failures=1), LIMITS,
     ("stop", 130, "stop: terminated by SIGINT (ft_launcher exit 1: not a clean stop)", 1, 0)),
    ("SIGHUP in slurm mode, no warning", Attempt(1, 1, False, terminated="SIGHUP", local=False),
     LIMITS, ("stop", 129, "stop: terminated by SIGHUP (ft_launcher exit 1: not a clean stop)", 0, 0)),
    ("SIGTERM after a warning, local: stop", Attempt(1, 0, False, "SIGUSR1", "SIGTERM"), LIMITS,
     ("stop", 143, "stop: terminated by SIGTERM (ft_launcher exit 0: the ranks stopped in time)",
      0, 0)),
    ("SIGTERM after a warning, slurm: the time limit, continue",
     Attempt(1, 1, False, "SIGUSR1", "SIGTERM", local=False, failures=1), LIMITS,
     ("continue", 0, "continue: warning signal SIGUSR1, not a failure (ft_launcher exit 1)", 1, 0)),
    ("warning", Attempt(1, 0, False, warned="SIGUSR2", failures=2), LIMITS,
     ("continue", 0, "continue: warning signal SIGUSR2, not a failure (ft_launcher exit 0)", 2, 0)),
    ("clean exit without the flag", Attempt(1, 0, False, failures=1), LIMITS,
     ("continue", 0, "continue: ft_launcher exited 0 without the flag, not a failure", 1, 0)),
    ("failure 1", Attempt(1, 1, False), LIMITS,
     ("continue", 0, "continue: failure 1 of at most 3 (ft_launcher exit 1)", 1, 1)),
    ("failure 2", Attempt(2, 1, False, failures=1), LIMITS,
     ("continue", 0, "continue: failure 2 of at most 3 (ft_launcher exit 1)", 2, 2)),
    ("failure at the maximum", Attempt(3, 1, False, failures=2), LIMITS,
     ("stop", 1, "stop: 3 consecutive failures, the maximum (ft_launcher exit 1)", 3, 0)),
    ("--max-failures 1", Attempt(1, 1, False), Limits(max_failures=1),
     ("stop", 1, "stop: 1 consecutive failures, the maximum (ft_launcher exit 1)", 1, 0)),
    ("ExcludeThisNode", Attempt(1, 65, False), LIMITS,
     ("continue", 0, "continue: failure 1 of at most 3 (ft_launcher exit 65, ExcludeThisNode)",
      1, 1)),
    ("forced stop by SIGTERM", Attempt(1, 143, False), LIMITS,
     ("continue", 0, "continue: failure 1 of at most 3 (ft_launcher exit 143, forced stop or "
      "killed by SIGTERM)", 1, 1)),
    ("killed by SIGKILL", Attempt(1, 137, False, failures=2), LIMITS,
     ("stop", 1, "stop: 3 consecutive failures, the maximum (ft_launcher exit 137, forced stop "
      "or killed by SIGKILL)", 3, 0)),
    ("128+N that names no signal", Attempt(1, 200, False), LIMITS,
     ("continue", 0, "continue: failure 1 of at most 3 (ft_launcher exit 200, forced stop or "
      "killed by SIG72)", 1, 1)),
    ("exit 128 itself is a plain failure", Attempt(1, 128, False), LIMITS,
     ("continue", 0, "continue: failure 1 of at most 3 (ft_launcher exit 128)", 1, 1)),
    ("any other code, as 1", Attempt(1, 3, False), LIMITS,
     ("continue", 0, "continue: failure 1 of at most 3 (ft_launcher exit 3)", 1, 1)),
    ("--max-attempts on a clean exit", Attempt(2, 0, False), Limits(max_attempts=2),
     ("stop", 1, "stop: --max-attempts 2 reached (ft_launcher exited 0 without the flag, not a "
      "failure)", 0, 0)),
    ("--max-attempts on a failure", Attempt(5, 1, False), Limits(max_attempts=5),
     ("stop", 1, "stop: --max-attempts 5 reached (failure 1 of at most 3 (ft_launcher exit 1))",
      1, 0)),
    ("--max-attempts not yet", Attempt(4, 0, False), Limits(max_attempts=5),
     ("continue", 0, "continue: ft_launcher exited 0 without the flag, not a failure", 0, 0)),
    ("--max-attempts 0: no limit", Attempt(10**6, 0, False), Limits(max_attempts=0),
     ("continue", 0, "continue: ft_launcher exited 0 without the flag, not a failure", 0, 0)),
    ("--max-attempts never turns finished into a stop", Attempt(9, 0, True), Limits(max_attempts=2),
     ("finished", 0, "finished: flag file present", 0, 0)),
    ("--max-attempts after a warning", Attempt(3, 0, False, warned="SIGUSR1"), Limits(max_attempts=3),
     ("stop", 1, "stop: --max-attempts 3 reached (warning signal SIGUSR1, not a failure "
      "(ft_launcher exit 0))", 0, 0)),
]


@pytest.mark.parametrize(("attempt", "limits", "expected"),
                         [row[1:] for row in DECIDE_ROWS], ids=[row[0] for row in DECIDE_ROWS])
def test_decide(attempt: Attempt, limits: Limits, expected: tuple) -> None:
    verdict = policy.decide(attempt, limits)
    assert (verdict.verdict, verdict.exit_code, verdict.text, verdict.shown_failures,
            verdict.failures) == expected


def test_every_launcher_code_of_the_table_has_a_row() -> None:
    tried = {row[1].rc for row in DECIDE_ROWS if not row[1].flag}
    for code in exit_codes.EXIT_CODES:
        assert code.value in tried or code.value + 15 in tried, code.name


# (name, attempt, limits) -> (verdict, exit, text, stalled carried)
CK = "/ck"
STALL_ROWS = [
    ("first stalled failure", Attempt(1, 1, False), Limits(10, 0, 2, CK),
     ("continue", 0, "continue: failure 1 of at most 10 (ft_launcher exit 1)", 1)),
    ("second stalled failure: stop, exit 3", Attempt(2, 1, False, failures=1, stalled=1),
     Limits(10, 0, 2, CK),
     ("stop", 3, "stop: no progress, 2 consecutive failed attempts without a newer file under "
      "/ck (ft_launcher exit 1)", 0)),
    ("progress resets the count", Attempt(2, 1, False, failures=1, stalled=1, progressed=True),
     Limits(10, 0, 2, CK),
     ("continue", 0, "continue: failure 2 of at most 10 (ft_launcher exit 1)", 0)),
    ("a stall beats --max-failures", Attempt(2, 1, False, failures=1, stalled=1),
     Limits(2, 0, 2, CK),
     ("stop", 3, "stop: no progress, 2 consecutive failed attempts without a newer file under "
      "/ck (ft_launcher exit 1)", 0)),
    ("a non-failure resets the count", Attempt(2, 0, False, stalled=1), Limits(10, 0, 2, CK),
     ("continue", 0, "continue: ft_launcher exited 0 without the flag, not a failure", 0)),
    ("a warning resets the count", Attempt(2, 0, False, warned="SIGUSR1", stalled=1),
     Limits(10, 0, 2, CK),
     ("continue", 0, "continue: warning signal SIGUSR1, not a failure (ft_launcher exit 0)", 0)),
    ("without --progress-path nothing stalls", Attempt(5, 1, False, failures=3, stalled=7),
     Limits(10, 0, 2, ""),
     ("continue", 0, "continue: failure 4 of at most 10 (ft_launcher exit 1)", 7)),
    ("--max-stalled 1", Attempt(1, 1, False), Limits(10, 0, 1, CK),
     ("stop", 3, "stop: no progress, 1 consecutive failed attempts without a newer file under "
      "/ck (ft_launcher exit 1)", 0)),
]


@pytest.mark.parametrize(("attempt", "limits", "expected"),
                         [row[1:] for row in STALL_ROWS], ids=[row[0] for row in STALL_ROWS])
def test_stalls(attempt: Attempt, limits: Limits, expected: tuple) -> None:
    verdict = policy.decide(attempt, limits)
    assert (verdict.verdict, verdict.exit_code, verdict.text, verdict.stalled) == expected


def test_the_no_progress_code_is_the_scripts_own() -> None:
    assert exit_codes.AUTORESUME_EXIT_NO_PROGRESS == 3
    verdict = policy.decide(Attempt(1, 1, False), Limits(10, 0, 1, CK))
    assert verdict.exit_code == exit_codes.AUTORESUME_EXIT_NO_PROGRESS


@pytest.mark.parametrize(("failures", "max_failures", "expected"), [
    (0, 3, ("continue", 0, "continue: no record of how it ended (the script was killed); "
            "failure 1 of at most 3", 1, 1)),
    (1, 3, ("continue", 0, "continue: no record of how it ended (the script was killed); "
            "failure 2 of at most 3", 2, 2)),
    (2, 3, ("stop", 1, "stop: no record of how it ended (the script was killed); 3 consecutive "
            "failures, the maximum", 3, 0)),
    (0, 1, ("stop", 1, "stop: no record of how it ended (the script was killed); 1 consecutive "
            "failures, the maximum", 1, 0)),
])
def test_killed_attempt(failures: int, max_failures: int, expected: tuple) -> None:
    verdict = policy.killed_attempt(failures, 1, Limits(max_failures))
    assert (verdict.verdict, verdict.exit_code, verdict.text, verdict.shown_failures,
            verdict.failures) == expected
    assert verdict.stalled == (0 if verdict.verdict == "stop" else 1)


def test_requeue_failed_text() -> None:
    assert policy.requeue_failed_text("continue: failure 1 of at most 3 (ft_launcher exit 1)") \
        == "stop: scontrol requeue failed (failure 1 of at most 3 (ft_launcher exit 1))"


# ---------------------------------------------------------------------------- exit codes


@pytest.mark.parametrize(("codes", "combined"), [
    ([], 0), ([0], 0), ([0, 0], 0), ([0, 1], 1), ([1, 0], 1), ([1, 64, 2], 64), ([2, 143], 2),
    ([143, 1], 143), ([65, 0], 65), ([0, 137, 65], 137), ([64, 64], 64), ([2, 0], 2),
])
def test_combine_codes(codes: list[int], combined: int) -> None:
    assert policy.combine_codes(codes) == combined


@pytest.mark.parametrize(("name", "code"), [
    ("SIGTERM", 143), ("TERM", 143), ("SIGINT", 130), ("SIGHUP", 129), ("SIGUSR1", 138)])
def test_signal_exit_code(name: str, code: int) -> None:
    assert policy.signal_exit_code(name) == code


def test_signal_exit_code_refuses_what_is_no_signal() -> None:
    with pytest.raises(ValueError):
        policy.signal_exit_code("SIGNOPE")


def test_the_script_holds_no_copy_of_the_exit_codes() -> None:
    text = SCRIPT.read_text()
    text = text[:text.index("usage() {")] + text[text.index("\nEOF\n"):]   # code, not help
    assert not re.search(r"^\s*(readonly|declare)\s.*EXIT_\w+=\d", text, re.M)
    # Literal exit statuses: 0 (done), and 2 where Python, which defines EXIT_USAGE, is missing.
    assert set(re.findall(r"\bexit (\d+)", text)) <= {"0", "2"}


# ---------------------------------------------------------------------------- nodes


@pytest.mark.parametrize(("line", "result", "report"), [
    ("n1 0 - - host1\n", "", NodeReport("n1", 0, "", "", (), "host1")),
    ("n1 143 USR1 TERM host1", "exit_code=143\noutcome=x\nroot_nodes=h2,h3\n",
     NodeReport("n1", 143, "USR1", "TERM", ("h2", "h3"), "host1")),
    ("n1 1 KILL QUIT host1", "", NodeReport("n1", 1, "", "", (), "host1")),
    ("n1 1 - - host1", "root_nodes=h2,b@d,,$(x),h3", NodeReport("n1", 1, "", "", ("h2", "h3"), "host1")),
    ("n1 1 - - host1", "root_nodes=\ngarbage", NodeReport("n1", 1, "", "", (), "host1")),
    ("n1 1 - - -", "", NodeReport("n1", 1, "", "", (), "n1")),
    ("n1 1 - -", "", None),
    ("n1 x - - h", "", None),
    ("n1 1234567890 - - h", "", None),
    ("-n1 0 - - h", "", None),
    ("n1 0 - - h extra", "", None),
    ("", "", None),
])
def test_parse_node_report(line: str, result: str, report: NodeReport | None) -> None:
    assert policy.parse_node_report(line, result) == report


def ok(node: str, code: int = 0, roots: tuple[str, ...] = (), host: str = "", warned: str = "",
       stopped: str = "") -> NodeReport:
    return NodeReport(node, code, warned, stopped, roots, host or node)


def test_nodes_outcome_combines_codes_and_keeps_the_order() -> None:
    out = policy.nodes_outcome([ok("n1"), ok("n2", 1)], ["n1", "n2"], 1)
    assert (out.rc, out.codes, out.bad_nodes, out.notes) == (1, [("n1", 0), ("n2", 1)], [], [])


@pytest.mark.parametrize(("srun_rc", "code"), [(0, 1), (1, 1), (137, 137)])
def test_a_node_without_report_is_lost_with_sruns_code(srun_rc: int, code: int) -> None:
    out = policy.nodes_outcome([ok("n1"), None], ["n1", "n2"], srun_rc)
    assert out.codes == [("n1", 0), ("n2", code)] and out.rc == code
    assert out.bad_nodes == ["n2"]
    assert out.notes == ["node n2 caused a failure: lost (its launcher never reported)"]


def test_a_lost_node_beyond_the_host_list_gets_a_name() -> None:
    assert policy.nodes_outcome([None], [], 0).bad_nodes == ["node0"]


def test_exclude_this_node_blames_its_node() -> None:
    out = policy.nodes_outcome([ok("n1", 65), ok("n2", 0)], ["n1", "n2"], 0)
    assert (out.rc, out.bad_nodes) == (65, ["n1"])
    assert out.notes == ["node n1 caused a failure: ExcludeThisNode"]


def test_signals_seen_by_node_tasks_first_one_wins() -> None:
    out = policy.nodes_outcome([ok("n1", warned="USR2"), ok("n2", warned="USR1", stopped="TERM"),
                                ok("n3", stopped="INT")], ["n1", "n2", "n3"], 0)
    assert (out.warned, out.terminated) == ("SIGUSR2", "SIGTERM")


ROOT_WHY = "root cause of the failure, as the launchers' records name it"
# (reports, hosts) -> (roots, nodes excluded at once, notes): a root is excluded only once it
# repeats (tests/unit/test_resume_repeats.py); a lost or ExcludeThisNode node at once.
ROOT_ROWS = [
    ("host name maps to the SLURM name",
     [ok("n1", 1, ("h2",), "h1"), ok("n2", 1, ("h2",), "h2")], ["n1", "n2"],
     (["n2"], []), [f"node n2 caused a failure: {ROOT_WHY}"]),
    ("two roots, each once",
     [ok("n1", 1, ("h2", "h1"), "h1"), ok("n2", 1, ("h1",), "h2")], ["n1", "n2"],
     (["n2", "n1"], []), [f"node n2 caused a failure: {ROOT_WHY}", f"node n1 caused a failure: {ROOT_WHY}"]),
    ("a host that is two virtual nodes is not excluded",
     [ok("n1", 1, ("box",), "box"), ok("n2", 1, (), "box")], ["n1", "n2"],
     ([], []), ["the launchers named host box as the root, which is more than one node of this "
          "allocation; not excluded"]),
    ("SLURM's own name is taken as is",
     [ok("n1", 1, ("n2",), "h1"), ok("n2", 1, (), "h2")], ["n1", "n2"],
     (["n2"], []), [f"node n2 caused a failure: {ROOT_WHY}"]),
    ("a host outside the allocation is not excluded",
     [ok("n1", 1, ("elsewhere",), "h1")], ["n1"],
     ([], []), ["the launchers named host elsewhere as the root, which is no node of this allocation "
          "(host=node: h1=n1); not excluded"]),
    ("a lost node explains the failure: roots are not blamed",
     [ok("n1", 1, ("h1",), "h1"), None], ["n1", "n2"],
     ([], ["n2"]), ["node n2 caused a failure: lost (its launcher never reported)",
              "not blaming h1 (named as root by the launchers): node(s) n2 lost, which explains "
              "the failure"]),
    ("a root that also exited 65 is listed once",
     [ok("n1", 65, ("h1",), "h1")], ["n1"],
     (["n1"], ["n1"]), ["node n1 caused a failure: ExcludeThisNode", f"node n1 caused a failure: {ROOT_WHY}"]),
]


@pytest.mark.parametrize(("reports", "hosts", "bad", "notes"), [row[1:] for row in ROOT_ROWS],
                         ids=[row[0] for row in ROOT_ROWS])
def test_root_nodes(reports: list, hosts: list[str], bad: tuple, notes: list[str]) -> None:
    out = policy.nodes_outcome(reports, hosts, 1)
    assert ((out.roots, out.bad_nodes), out.notes) == (bad, notes)


# ---------------------------------------------------------------------------- exclusion

EXCLUSION_ROWS = [
    ("--max-excluded 0: never", [], ["a"], 0, None, 1, ((), False, "")),
    ("nothing to exclude: no update", [], [], 4, 10, 1, ((), False, "")),
    ("a new bad node", [], ["a"], 4, 10, 1, (("a",), True, "")),
    ("kept from before, oldest first", ["a"], ["b"], 4, 10, 1, (("a", "b"), True, "")),
    ("no repeats", ["a"], ["a", "b", "b"], 4, 10, 1, (("a", "b"), True, "")),
    ("at most --max-excluded: the oldest go", ["a", "b", "c", "d"], ["e"], 4, 10, 1,
     (("b", "c", "d", "e"), True, "")),
    ("--max-excluded 1", ["a"], ["b"], 1, 10, 1, (("b",), True, "")),
    ("previous list alone is kept", ["a"], [], 4, 10, 1, (("a",), True, "")),
    ("exactly fits", ["a"], ["b"], 4, 3, 1, (("a", "b"), True, "")),
    ("would not fit: dropped", ["a"], ["b"], 4, 2, 1,
     ((), True, "not excluding a b: 1 node(s) would no longer fit in the 2 of the partition; "
                "list dropped")),
    ("multi-node job would not fit", [], ["a"], 4, 4, 4,
     ((), True, "not excluding a: 4 node(s) would no longer fit in the 4 of the partition; "
                "list dropped")),
    ("partition size unknown: kept", ["a"], ["b"], 4, None, 1, (("a", "b"), True, "")),
]


@pytest.mark.parametrize(("previous", "bad", "max_excluded", "partition", "need", "expected"),
                         [row[1:] for row in EXCLUSION_ROWS], ids=[row[0] for row in EXCLUSION_ROWS])
def test_exclusion(previous: list[str], bad: list[str], max_excluded: int, partition: int | None,
                   need: int, expected: tuple) -> None:
    excl = policy.exclusion(previous, bad, max_excluded, partition, need)
    assert (excl.nodes, excl.update, excl.note) == expected


# A --no-kill job SLURM shrank from 3 to 2 nodes (NumNodes=2 after node3 was lost), on a 3-node
# partition: (name, requested, NumNodes now, --nnodes MIN, bad nodes) -> (nodes the requeued
# job asks for, exclusion list, note). Before, the requested 3 was used: "not excluding node3:
# 3 node(s) would no longer fit in the 3 of the partition", and the job waited for node3.
SHRUNK_ROWS = [
    ("elastic 2:3, shrank to 2: exclude the lost node", 3, 2, 2, ["node3"], (2, ("node3",), "")),
    ("elastic 1:3, shrank to 2", 3, 2, 1, ["node3"], (2, ("node3",), "")),
    ("elastic, shrank below MIN: the request stands", 3, 1, 2, ["node3"],
     (3, (), "not excluding node3: 3 node(s) would no longer fit in the 3 of the partition; list dropped")),
    ("--nnodes 3 (not elastic): never made smaller", 3, 2, 0, ["node3"],
     (3, (), "not excluding node3: 3 node(s) would no longer fit in the 3 of the partition; list dropped")),
    ("NumNodes unknown: the request", 3, None, 2, ["node3"],
     (3, (), "not excluding node3: 3 node(s) would no longer fit in the 3 of the partition; list dropped")),
    ("did not shrink", 3, 3, 2, ["node3"],
     (3, (), "not excluding node3: 3 node(s) would no longer fit in the 3 of the partition; list dropped")),
]


@pytest.mark.parametrize(("requested", "current", "min_nodes", "bad", "expected"),
                         [row[1:] for row in SHRUNK_ROWS], ids=[row[0] for row in SHRUNK_ROWS])
def test_exclusion_of_a_shrunk_job(requested: int, current: int | None, min_nodes: int, bad: list[str],
                                   expected: tuple) -> None:
    need = policy.needed_nodes(requested, current, min_nodes)
    excl = policy.exclusion([], bad, 4, 3, need)
    assert (need, excl.nodes, excl.note) == expected


@pytest.mark.parametrize(("args", "nnodes", "elastic"), [
    ([], None, 0),
    (["--nproc-per-node", "8"], None, 0),
    (["--nnodes", "2:3"], "2:3", 2),
    (["--nnodes=1:4", "--max-restarts", "3"], "1:4", 1),
    (["--nnodes", "3"], "3", 0),
    (["--nnodes", "3:3"], "3:3", 0),
    (["--nnodes", "2:3", "--nnodes=3"], "3", 0),  # the last one wins, as in torch's parser
    (["--nnodes"], None, 0),
])
def test_launcher_nnodes(args: list[str], nnodes: str | None, elastic: int) -> None:
    assert policy.launcher_nnodes(args) == nnodes
    assert policy.elastic_min(nnodes) == elastic


@pytest.mark.parametrize(("nodes", "requested", "ntasks", "fields"), [
    (0, 3, "3", []),
    (2, 3, "3", ["NumNodes=2", "NumTasks=2"]),
    (2, 3, "6", ["NumNodes=2", "NumTasks=4"]),
    (2, 3, None, ["NumNodes=2"]),
    (2, 3, "4", ["NumNodes=2"]),  # not as many tasks on every node: left to SLURM
])
def test_node_count_fields(nodes: int, requested: int, ntasks: str | None, fields: list[str]) -> None:
    assert policy.node_count_fields(nodes, requested, ntasks) == fields


@pytest.mark.parametrize(("excl", "text"), [
    (policy.Exclusion(), "continue: x; job 17_3 requeued"),
    (policy.Exclusion(("a", "b"), True), "continue: x; job 17_3 requeued excluding a,b"),
    (policy.Exclusion((), True), "continue: x; job 17_3 requeued excluding no node"),
])
def test_requeued_text(excl: policy.Exclusion, text: str) -> None:
    assert policy.requeued_text("continue: x", "17_3", excl) == text


# ---------------------------------------------------------------------------- run-dir files


@pytest.mark.parametrize(("text", "state"), [
    ("", history.State()),
    ("attempt=4\nfailures=2\nrunning=1\nstart=2026-01-01T00:00:00+0000\njob_id=17\nstalled=1\n"
     "progress=123\n",
     history.State(4, 2, 1, True, "2026-01-01T00:00:00+0000", "17", "123")),
    ("attempt=x\nfailures=-1\nstalled=1234567890\nrunning=yes\n", history.State()),
    ("garbage\n=1\nunknown=5\nattempt=07\n", history.State(attempt=7)),
    ("attempt=3\nattempt=5", history.State(attempt=5)),
    ("attempt=3\nfailu", history.State(attempt=3)),   # cut short
])
def test_parse_state(text: str, state: history.State) -> None:
    assert history.parse_state(text) == state


def test_state_round_trip_and_atomic_write(tmp_path: Path) -> None:
    state = history.State(9, 2, 1, True, "2026-01-01T00:00:00+0000", "17_2", "1700000000000000000")
    history.write_state(str(tmp_path), state)
    assert history.read_state(str(tmp_path)) == state
    assert os.listdir(tmp_path) == ["state"]
    assert history.read_state(str(tmp_path / "none")) == history.State()
    assert state.ended(failures=0) == history.State(9, 0, 1)


HEADER = "attempt\tjob_id\tstart\tend\texit_code\tflag\tfailures\tdecision"


def test_history_header_is_the_documented_one() -> None:
    assert history.HISTORY_HEADER == HEADER


def test_parse_history_skips_the_header_and_corrupt_lines() -> None:
    lines = [
        HEADER,
        "1\tlocal\ts\te\t1\tno\t1\tcontinue: failure 1 of at most 3 (ft_launcher exit 1)",
        "2\tlocal\ts\te\t1\tno\t2\tcontin",                    # fine: a short decision is still one
        "3\tlocal\ts\te\t1\tno",                                # cut short
        "x\tlocal\ts\te\t1\tno\t1\tcontinue",                   # not a number
        "4\tlocal\ts\te\t1\tno\tmany\tcontinue",
        "5\tlocal\ts\te\t1\tno\t1\tcontinue\textra",
        "6\tlocal\ts\te\t1\tno\t1\t",                           # no decision
        "",
        "7\t17\ts\t-\t-\tyes\t0\tfinished: flag file present\n",
    ]
    rows = history.parse_history(lines)
    assert [row.attempt for row in rows] == [1, 2, 7]
    assert rows[2] == history.HistoryRow(7, "17", "s", "-", "-", "yes", 0,
                                         "finished: flag file present")


def test_append_history_writes_the_header_once_and_whole_lines(tmp_path: Path) -> None:
    run_dir = str(tmp_path)
    assert history.read_history(run_dir) == []
    fields = history.history_fields(1, "local", "s", "e", 1, False, 1)
    history.append_history(run_dir, fields, "continue: a\tb\nc")
    history.ensure_history_header(run_dir)
    history.append_history(run_dir, history.history_fields(2, "local", "s", "e", 0, True, 0),
                           "finished: flag file present")
    lines = (tmp_path / "history.tsv").read_text().splitlines()
    assert lines == [HEADER, "1\tlocal\ts\te\t1\tno\t1\tcontinue: a b c",
                     "2\tlocal\ts\te\t0\tyes\t0\tfinished: flag file present"]
    assert [row.attempt for row in history.read_history(run_dir)] == [1, 2]


@pytest.mark.parametrize(("value", "field"), [
    ("a\tb", "a b"), ("a\nb", "a b"), ("", "-"), ("  x  ", "x"), (3, "3")])
def test_one_field(value: object, field: str) -> None:
    assert history.one_field(value) == field


def test_excluded_nodes_file(tmp_path: Path) -> None:
    run_dir = str(tmp_path)
    assert history.read_excluded(run_dir) == []
    history.write_excluded(run_dir, ["a", "b"])
    assert history.read_excluded(run_dir) == ["a", "b"]
    (tmp_path / "excluded_nodes").write_text("a\n\n b \nx;rm -rf /\n$(reboot)\nc")
    assert history.read_excluded(run_dir) == ["a", "b", "c"]
    history.write_excluded(run_dir, [])
    assert not (tmp_path / "excluded_nodes").exists()
    history.write_excluded(run_dir, [])   # nothing to remove: no error


def test_newest_mtime(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    assert history.newest_mtime("") == ""
    assert history.newest_mtime(str(ck)) == ""
    ck.mkdir()
    assert history.newest_mtime(str(ck)) == ""
    (ck / "sub").mkdir()
    old = ck / "sub" / "step_1.pt"
    old.write_text("x")
    os.utime(old, ns=(10**18, 10**18))
    assert history.newest_mtime(str(ck)) == str(10**18)
    assert history.newest_mtime(str(old)) == str(10**18)
    outside = tmp_path / "outside"
    outside.write_text("y")
    (ck / "link").symlink_to(outside)   # a link is not progress
    assert history.newest_mtime(str(ck)) == str(10**18)
    (ck / "step_2.pt").write_text("z")
    assert int(history.newest_mtime(str(ck))) > 10**18


# ---------------------------------------------------------------------------- options

ENV_NONE: dict[str, str] = {}


@pytest.mark.parametrize(("args", "field", "value"), [
    (["--run-dir", "r", "t.py"], "run_dir", "r"),
    (["-d", "r", "t.py"], "run_dir", "r"),
    (["--run-dir=r=s", "t.py"], "run_dir", "r=s"),
    (["-m", "5", "t.py"], "max_failures", "5"),
    (["--max-failures=5", "t.py"], "max_failures", "5"),
    (["-a", "--x", "--launcher-arg=--y z", "t.py"], "extra_launcher_args", ["--x", "--y z"]),
    (["--launcher-args", "--a b", "t.py"], "launcher_args_str", "--a b"),
    (["--mode=local", "t.py"], "mode", "local"),
    (["--", "-x", "--run-dir", "y"], "command", ["-x", "--run-dir", "y"]),
    (["t.py", "--run-dir", "y"], "command", ["t.py", "--run-dir", "y"]),
    (["--max-stalled", "--help"], "max_stalled", "--help"),   # a value, not the help
    (["--run-dir", "r", "--help", "t.py"], "help", True),
])
def test_parse_args(args: list[str], field: str, value: object) -> None:
    assert getattr(options.parse_args(args, options.from_environment(ENV_NONE)), field) == value


@pytest.mark.parametrize(("args", "message"), [
    (["--frobnicate", "t.py"], "unknown option '--frobnicate'"),
    (["-d=x", "t.py"], "unknown option '-d=x'"),
    (["-"], "unknown option '-'"),
    (["--run-dir"], "option --run-dir needs a value"),
    (["t.py", "-m"], None),
])
def test_parse_args_errors(args: list[str], message: str | None) -> None:
    if message is None:
        options.parse_args(args, options.from_environment(ENV_NONE))
        return
    with pytest.raises(options.AutoresumeUsageError, match=re.escape(message)):
        options.parse_args(args, options.from_environment(ENV_NONE))


def test_environment_and_flags() -> None:
    env = {"AUTORESUME_MAX_FAILURES": "7", "AUTORESUME_MAX_ATTEMPTS": "", "FT_LAUNCHER": "/x",
           "AUTORESUME_LAUNCHER_ARGS": ""}
    opts = options.from_environment(env)
    assert (opts.max_failures, opts.max_attempts, opts.launcher, opts.launcher_args_set) == \
        ("7", "0", "/x", True)
    assert options.parse_args(["-m", "2", "t"], opts).max_failures == "2"


@pytest.fixture
def launcher(tmp_path: Path) -> str:
    path = tmp_path / "bin" / "ft_launcher"
    path.parent.mkdir()
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize(("args", "env", "message"), [
    ([], {}, "no training command given"),
    (["-m", "zero", "t"], {}, "--max-failures (AUTORESUME_MAX_FAILURES) must be a whole number >= 1 "
                              "and <= 1000000, got 'zero'"),
    (["-m", "0", "t"], {}, "got '0'"),
    (["-m", "1000001", "t"], {}, "got '1000001'"),
    ([], {"AUTORESUME_MAX_FAILURES": "x"}, "no training command given"),
    (["t"], {"AUTORESUME_MAX_FAILURES": "x"}, "got 'x'"),
    (["--max-attempts", "-1", "t"], {}, "--max-attempts (AUTORESUME_MAX_ATTEMPTS) must be a whole "
                                        "number <= 1000000 (0 = no limit), got '-1'"),
    (["--max-attempts", "99999999999999999999", "t"], {}, "got '99999999999999999999'"),
    (["--max-excluded", "1001", "t"], {}, "--max-excluded (AUTORESUME_MAX_EXCLUDED) must be a "
                                          "whole number <= 1000, got '1001'"),
    (["--max-stalled", "0", "t"], {}, "--max-stalled (AUTORESUME_MAX_STALLED) must be a whole "
                                      "number >= 1 and <= 1000000, got '0'"),
    (["--mode", "cloud", "t"], {}, "--mode (AUTORESUME_MODE) must be auto, slurm or local, got "
                                   "'cloud'"),
    (["--mode", "slurm", "t"], {}, "--mode slurm needs to run inside an sbatch job"),
    (["--rdzv-port", "65536", "t"], {}, "--rdzv-port (AUTORESUME_RDZV_PORT) must be a TCP port "
                                        "1-65535, got '65536'"),
    (["--launcher", "/nonexistent/ft_launcher", "t"], {},
     "ft_launcher not found: --launcher (FT_LAUNCHER) is '/nonexistent/ft_launcher'"),
    (["--launcher", "/", "t"], {}, "--launcher (FT_LAUNCHER) '/' is not an executable file"),
    (["-f", "/nonexistent/dir/flag", "t"], {}, "the directory of --flag-file"),
])
def test_validate_errors(tmp_path: Path, launcher: str, monkeypatch: pytest.MonkeyPatch,
                         args: list[str], env: dict[str, str], message: str) -> None:
    monkeypatch.chdir(tmp_path)
    opts = options.from_environment({"FT_LAUNCHER": launcher, **env})
    with pytest.raises(options.AutoresumeUsageError, match=re.escape(message)):
        options.validate(options.parse_args(args, opts), env)
    if "flag-file" not in message:
        assert not (tmp_path / "autoresume").exists()


def test_validate_normalises(tmp_path: Path, launcher: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    opts = options.from_environment({"FT_LAUNCHER": launcher})
    opts = options.validate(options.parse_args(["-m", "010", "-a", "--x", "t.py"], opts), {})
    assert (opts.max_failures, opts.mode, opts.launcher) == ("10", "local", launcher)
    assert opts.run_dir == str(tmp_path / "autoresume") and Path(opts.run_dir).is_dir()
    assert opts.flag_file == str(tmp_path / "autoresume" / "finished.flag")
    assert opts.launcher_args == ["--x"]   # an -a given: no --standalone
    opts = options.validate(options.parse_args(["-f", "f", "t.py"], options.from_environment(
        {"FT_LAUNCHER": launcher, "AUTORESUME_SRUN_ARGS": "--a  b"})), {"SLURM_JOB_ID": "3",
                                                                       "SLURM_STEP_ID": "0"})
    assert (opts.flag_file, opts.launcher_args, opts.srun_args, opts.mode) == \
        (str(tmp_path / "f"), ["--standalone"], ["--a", "b"], "local")


# ---------------------------------------------------------------------------- the command line


def run_step(*args: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """Run a step as the script does; its assignments as bash sees them after eval."""
    code = """out=$("$PY" -m launcher.resume "$@") || exit; eval "$out"
for v in VERDICT SCRIPT_RC DECISION HISTORY_FIELDS HISTORY_HEADER DECISION_REQUEUED EXCLUDE_UPDATE EXCLUDE_LIST \\
         STOP ATTEMPT HELP RUN_DIR MODE; do
  [ -z "${!v+x}" ] || printf '%s=%s\\0' "$v" "${!v}"
done
if [ -n "${COMMAND+x}" ]; then
  printf 'COMMAND='; printf '<%s>' "${COMMAND[@]}"; printf '\\0'
  printf 'LAUNCHER_ARGS='; printf '<%s>' "${LAUNCHER_ARGS[@]}"; printf '\\0'
fi"""
    proc = subprocess.run(["bash", "-c", code, "step", *args], capture_output=True, text=True,
                          env={**os.environ, "PY": sys.executable,
                               "PYTHONPATH": str(REPO), **(env or {})}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    values = {}
    for item in proc.stdout.split("\0")[:-1]:
        name, _, value = item.partition("=")
        values[name] = value
    values["stderr"] = proc.stderr
    return values


def test_config_output_is_shell_safe(tmp_path: Path, launcher: str) -> None:
    nasty = ["t.py", "a b", "it's", '"q"', "$(touch pwned)", "`touch pwned`", "x\ny", "*", ""]
    run_dir = tmp_path / "r un's \"$(touch pwned)\" `touch pwned`"
    out = run_step("config", "--launcher", launcher, "-d", str(run_dir), "--", *nasty,
                   env={"AUTORESUME_LAUNCHER_ARGS": "--nproc-per-node 2"})
    assert out["COMMAND"] == "".join(f"<{arg}>" for arg in nasty)
    assert out["LAUNCHER_ARGS"] == "<--nproc-per-node><2>"
    assert out["MODE"] == "local" and out["RUN_DIR"] == str(run_dir)
    assert not list(tmp_path.rglob("pwned")) and not Path("pwned").exists()


def test_config_leaves_out_its_nnodes_when_the_user_gives_one(tmp_path: Path, launcher: str) -> None:
    code = 'eval "$("$PY" -m launcher.resume config "$@")"; printf "%s:%s" "${#NNODES_ARGS[@]}" "${NNODES_ARGS[*]}"'
    for launcher_args, shown in (("--nnodes 2:3 --nproc-per-node 2", "0:"), ("--nproc-per-node 2", "1:--nnodes=1")):
        proc = subprocess.run(["bash", "-c", code, "step", "--launcher", launcher, "-d", str(tmp_path / "r"),
                               "--launcher-args", launcher_args, "--", "t.py"], capture_output=True, text=True,
                              env={**os.environ, "PY": sys.executable, "PYTHONPATH": str(REPO)}, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == shown, (launcher_args, proc.stdout)


def test_config_usage_error_exits_2(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "launcher.resume", "config", "-m", "0", "t"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == exit_codes.EXIT_USAGE and proc.stdout == ""
    assert proc.stderr.startswith("autoresume.sh: error: --max-failures")
    assert proc.stderr.endswith("Try 'autoresume.sh --help'.\n")


def settings_args(run_dir: Path, **changes: object) -> list[str]:
    settings = cli.Settings(run_dir=str(run_dir), flag_file=str(run_dir / "finished.flag"))
    return [*settings.to_args(), *(f"--{k.replace('_', '-')}={v}" for k, v in changes.items())]


def test_local_steps_fail_twice_then_finish(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    args = settings_args(run)
    assert run_step("resume", *args)["STOP"] == ""
    for attempt, rc in ((1, 1), (2, 1)):
        assert run_step("start", *args)["ATTEMPT"] == str(attempt)
        assert "running=1" in (run / "state").read_text()
        out = run_step("decide", *args, f"--rc={rc}", "--warned=", "--terminated=")
        assert (out["VERDICT"], out["SCRIPT_RC"]) == ("continue", "0")
        assert out["DECISION"] == f"continue: failure {attempt} of at most 3 (ft_launcher exit 1)"
        assert out["HISTORY_FIELDS"].split("\t")[:2] == [str(attempt), "local"]
        assert out["HISTORY_FIELDS"].split("\t")[4:] == ["1", "no", str(attempt)]
    run_step("start", *args)
    (run / "finished.flag").write_text("")
    out = run_step("decide", *args, "--rc=0")
    assert (out["VERDICT"], out["DECISION"]) == ("finished", "finished: flag file present")
    assert history.read_state(str(run)) == history.State(attempt=3)
    assert out["HISTORY_HEADER"] == HEADER
    assert not (run / "history.tsv").exists()   # the script writes header and lines
    assert run_step("resume", *args)["STOP"] == "0"


def test_steps_count_attempts_without_progress(tmp_path: Path) -> None:
    run, ck = tmp_path / "run", tmp_path / "ck"
    run.mkdir()
    ck.mkdir()
    (ck / "step_1.pt").write_text("x")
    os.utime(ck / "step_1.pt", ns=(10**18, 10**18))
    args = settings_args(run, progress_path=ck, max_failures=10, max_stalled=3)
    run_step("start", *args)
    assert run_step("decide", *args, "--rc=1")["VERDICT"] == "continue"
    assert history.read_state(str(run)).stalled == 1
    run_step("start", *args)
    (ck / "step_2.pt").write_text("y")   # a checkpoint: progress
    run_step("decide", *args, "--rc=1")
    assert history.read_state(str(run)).stalled == 0
    for stalled in (1, 2):
        run_step("start", *args)
        run_step("decide", *args, "--rc=1")
        assert history.read_state(str(run)).stalled == stalled
    run_step("start", *args)
    out = run_step("decide", *args, "--rc=1")
    assert (out["VERDICT"], out["SCRIPT_RC"]) == ("stop", "3")
    assert out["DECISION"].startswith("stop: no progress, 3 consecutive failed attempts")


def test_resume_records_a_killed_scripts_attempt(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    args = settings_args(run, max_failures=2)
    run_step("start", *args)   # ... and the script is SIGKILLed
    out = run_step("resume", *args)
    assert (out["STOP"], out["ATTEMPT"]) == ("", "1")
    rows = history.read_history(str(run))
    assert [(r.attempt, r.end, r.exit_code, r.failures) for r in rows] == [(1, "-", "-", 1)]
    assert rows[0].decision.startswith("continue: no record of how it ended")
    run_step("start", *args)   # killed again: the maximum
    out = run_step("resume", *args)
    assert out["STOP"] == str(exit_codes.EXIT_FAILURE)
    assert "attempt 2 ended without a record and the maximum of 2" in out["stderr"]
    assert history.read_state(str(run)) == history.State(attempt=2)


def test_attempts_are_numbered_on_from_the_history_without_a_state(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    history.append_history(str(run), history.history_fields(41, "local", "s", "e", 1, False, 1),
                           "continue: x")
    assert run_step("start", *settings_args(run))["ATTEMPT"] == "42"


def test_slurm_decide_reads_the_node_reports_and_excludes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    results = run / "nodes"
    results.mkdir(parents=True)
    (results / "node.0").write_text("n1 1 - - h1\n")
    (results / "node.1").write_text("n2 1 - - h2\n")
    (results / "launcher.1").write_text("exit_code=1\noutcome=failed\nroot_nodes=h1\n")
    args = settings_args(run, mode="slurm", job_id="17", job_ref="17", hosts="n1,n2,n3",
                         nnodes=3, max_excluded=4)
    run_step("start", *args)
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    (tmp_path / "bin").mkdir()
    sinfo = tmp_path / "bin" / "sinfo"
    sinfo.write_text("#!/bin/sh\nprintf 'n1\\nn2\\nn3\\nn4\\nn5\\nn1\\n'\n")
    sinfo.chmod(0o755)
    out = run_step("decide", *args, "--srun-rc=1", f"--results={results}", "--warned=",
                   "--terminated=", env=env)
    assert out["VERDICT"] == "continue"
    assert "attempt 1: node n3 caused a failure: lost (its launcher never reported)" in out["stderr"]
    assert "not blaming h1" in out["stderr"]
    assert "attempt 1: launchers exited n1:1 n2:1 n3:1 (srun 1)" in out["stderr"]
    assert (out["EXCLUDE_UPDATE"], out["EXCLUDE_LIST"]) == ("1", "n3")
    assert out["DECISION_REQUEUED"] == \
        "continue: failure 1 of at most 3 (ft_launcher exit 1); job 17 requeued excluding n3"
    assert history.read_excluded(str(run)) == ["n3"] and not results.exists()
    out = run_step("requeue-failed", *args, f"--decision={out['DECISION']}")
    assert (out["VERDICT"], out["SCRIPT_RC"]) == ("stop", "1")
    assert out["DECISION"] == "stop: scontrol requeue failed (failure 1 of at most 3 (ft_launcher " \
                              "exit 1))"
    assert history.read_state(str(run)).failures == 0


def test_a_bad_step_is_a_usage_error() -> None:
    assert cli.main(["nope", "--run-dir=/x", "--flag-file=/x/f"], {}) == exit_codes.EXIT_USAGE
    assert cli.main(["start", "positional"], {}) == exit_codes.EXIT_USAGE
    assert cli.main([], {}) == exit_codes.EXIT_USAGE


def test_the_policy_imports_nothing_heavy() -> None:
    # It runs between attempts: no torch, no ft_core, only the launcher package's light modules.
    code = ("import sys, launcher.resume.__main__; "
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'numpy', 'ft_core', 'launcher', 'ptl_resiliency', 'lightning'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.split() == ["launcher", "launcher.exit_codes", "launcher.resume",
                                   "launcher.resume.__main__", "launcher.resume.history",
                                   "launcher.resume.own_files", "launcher.resume.policy",
                                   "launcher.resume.repeats"]
