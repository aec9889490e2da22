"""``ft_launcher``: torchrun with fault tolerance (see :mod:`launcher.cli`).

The reference's ``nvidia_resiliency_ext.fault_tolerance.launcher`` module is this package:
``get_args_parser`` and ``main`` are :mod:`launcher.cli`'s, re-exported lazily so that
``import launcher`` stays light (``launcher.cli`` imports torch).
"""

from typing import Any

__all__ = ["get_args_parser", "main"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from launcher import cli

        return getattr(cli, name)
    raise AttributeError(f"module 'launcher' has no attribute {name!r}")
