"""``ft_core.config``, a public module path (the reference's or our documented one).

The module lives at :mod:`ft_core.wire.config`; this path is the same module object, so every name,
and every patch of one, is shared by both paths.
"""

import sys

from ft_core.wire import config as _module

sys.modules[__name__] = _module
