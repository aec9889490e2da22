"""The ``torchrun.handlers`` entry point's path before the move (``launcher.rendezvous_plugin:torchrun_handler``).

Installs made before :mod:`launcher.rendezvous.plugin` existed name this module in their entry
points; like the new module it imports nothing heavy (torch loads it mid-import).
"""

from launcher.rendezvous.plugin import create_ft_barrier_handler, torchrun_handler

__all__ = ["create_ft_barrier_handler", "torchrun_handler"]
