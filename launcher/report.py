"""``launcher.report``, ``ft_report``'s documented path (``python -m launcher.report``, ``launcher.report:main``).

The module lives at :mod:`launcher.events.report`; this path is the same module object (as the
public paths of ``ft_core`` are), so every name, and every patch of one, is shared by both paths.
"""

import sys

from launcher.events import report as _module

if __name__ == "__main__":
    sys.exit(_module.main())
sys.modules[__name__] = _module
