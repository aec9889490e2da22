"""Straggler (fail-slow rank and node) detection. See ``docs/stragglers.md``.

Standard library and torch only; the rank monitor never imports this package.
"""

from ft_core.straggler.detector import CallableId, Detector
from ft_core.straggler.engine import StragglerEngine
from ft_core.straggler.scores import Report, StragglerId

__all__ = ["CallableId", "Detector", "Report", "StragglerEngine", "StragglerId"]
