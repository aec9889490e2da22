"""``ft_core.simulated_fault``, a public module path (the reference's or our documented one).

The module lives at :mod:`ft_core.client.simulated_fault`; this path is the same module object, so every name,
and every patch of one, is shared by both paths.
"""

import sys

from ft_core.client import simulated_fault as _module

sys.modules[__name__] = _module
