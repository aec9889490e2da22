"""The exit codes are defined once (launcher/exit_codes.py); every copy agrees with that table."""

from __future__ import annotations

import re
from pathlib import Path

from launcher import get_args_parser
from launcher.exit_codes import AUTORESUME_ONLY_CODES, EXIT_CODES, help_epilog

REPO = Path(__file__).resolve().parents[2]
AUTORESUME = (REPO / "scripts" / "autoresume.sh").read_text()
BY_CODE = {row.code: row for row in EXIT_CODES}


def test_the_table_is_consistent():
    assert len({row.value for row in EXIT_CODES}) == len(EXIT_CODES)
    for row in EXIT_CODES:
        assert row.code == str(row.value) or row.code == f"{row.value}+N", row


def test_help_lists_every_code_from_the_table():
    text = get_args_parser().format_help()
    assert help_epilog() in text
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ") and line.split()}
    for row in EXIT_CODES:
        assert row.code in lines, row.code
        assert lines[row.code].split(None, 1)[1] == row.meaning[: len(lines[row.code].split(None, 1)[1])]


def test_autoresume_holds_no_copy_of_the_codes():
    # The script's decisions import launcher.exit_codes (through launcher.resume): one source.
    assert not re.search(r"^readonly EXIT_\w+=", AUTORESUME, re.M)
    policy = (REPO / "launcher" / "resume" / "policy.py").read_text()
    assert "from launcher.exit_codes import" in policy


def test_autoresume_own_codes_are_distinct_and_documented():
    for name, value in AUTORESUME_ONLY_CODES.items():
        assert value not in {row.value for row in EXIT_CODES}, name
        assert re.search(rf"^{value} no progress", AUTORESUME[AUTORESUME.index("Exit codes of this script"):], re.M)


def _launcher_codes_in(text: str, pattern: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(0)) for m in re.finditer(pattern, text)]


def test_autoresume_help_describes_the_codes_as_the_table_does():
    usage = AUTORESUME[AUTORESUME.index("usage() {"): AUTORESUME.index("\nEOF\n")]
    mentioned = _launcher_codes_in(usage, r"launcher exit (\d+(?:\+N)?)\b[^\n]*")
    assert {code for code, _ in mentioned} == set(BY_CODE), mentioned
    for code, line in mentioned:
        assert BY_CODE[code].keyword.lower() in line.lower() or code in ("0",), line


def test_docs_launcher_table_matches():
    text = (REPO / "docs" / "launcher.md").read_text()
    section = text[text.index("## Exit codes"):]
    section = section[: section.index("\n## ", 1)]
    rows = re.findall(r"^\| (\S+) \| (.+?) \|$", section, re.M)
    rows = [(code, meaning.replace("`", "")) for code, meaning in rows if code not in ("code", "---")]
    assert rows == [(row.code, row.meaning) for row in EXIT_CODES]


def test_docs_autoresume_table_uses_the_same_codes():
    text = (REPO / "docs" / "autoresume.md").read_text()
    mentioned = _launcher_codes_in(text, r"(?m)^\| launcher exit \**(\d+(?:\+N)?)\**[^\n]*")
    assert {code for code, _ in mentioned} == set(BY_CODE), mentioned
    for code, line in mentioned:
        assert BY_CODE[code].keyword.lower() in line.lower() or code == "0", line
