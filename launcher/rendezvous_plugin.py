"""``launcher.rendezvous_plugin``, the ``torchrun.handlers`` entry point's path before the move.

Installs made before :mod:`launcher.rendezvous.plugin` existed name
``launcher.rendezvous_plugin:torchrun_handler``; this path is the same module object, which
imports nothing heavy (torch loads it in the middle of its own package import).
"""

import sys

from launcher.rendezvous import plugin as _module

sys.modules[__name__] = _module
