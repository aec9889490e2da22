"""``launcher.records``, the event log schema's documented path (``launcher.records.read_events``).

The module lives at :mod:`launcher.events.records`; this path is the same module object (as the
public paths of ``ft_core`` are), so every name, and every patch of one, is shared by both paths.
"""

import sys

from launcher.events import records as _module

sys.modules[__name__] = _module
