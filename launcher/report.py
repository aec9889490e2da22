"""``ft_report``'s documented path (``python -m launcher.report``, ``launcher.report:main``).

The code is :mod:`launcher.events.report`; this module stays for commands and installs that
name the old path.
"""

import sys

from launcher.events.report import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
