"""docs/stragglers.md's first example says which of its arguments are not the defaults (issue 29.12).

It once said ``# defaults below`` next to ``action="replace"``, whose default is ``"report"``: a
user who copies it gets node replacement believing it is the default behaviour.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
from pathlib import Path

from ptl_resiliency import StragglerDetectionCallback

DOC = Path(__file__).resolve().parents[2] / "docs" / "stragglers.md"


def first_python_block() -> str:
    match = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert match, f"no python example in {DOC}"
    return match.group(1)


def test_each_argument_of_the_first_example_is_called_default_only_when_it_is():
    block = first_python_block()
    calls = [node for node in ast.walk(ast.parse(block)) if isinstance(node, ast.Call)
             and getattr(node.func, "id", None) == "StragglerDetectionCallback"]
    assert len(calls) == 1, block
    comments = " ".join(line.split("#", 1)[1] for line in block.splitlines() if "#" in line)
    assert "defaults below" not in comments
    parameters = inspect.signature(StragglerDetectionCallback).parameters
    for keyword in calls[0].keywords:
        value, default = ast.literal_eval(keyword.value), parameters[keyword.arg].default
        if value != default:  # the comment must not let it pass for the default: it names the default
            shown = json.dumps(default) if isinstance(default, str) else f"{default:g}"
            assert f"default {keyword.arg} is {shown}" in comments, (keyword.arg, comments)
