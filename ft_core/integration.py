"""``ft_core.integration``, a public module path (the reference's or our documented one).

The module lives at :mod:`ft_core.client.integration`; this path is the same module object, so every name,
and every patch of one, is shared by both paths.
"""

import sys

from ft_core.client import integration as _module

sys.modules[__name__] = _module
