"""``ft-barrier`` for plain ``torchrun``: the entry point torch's rendezvous registry loads.

torch registers every ``torchrun.handlers`` entry point of the installed packages when
``torch.distributed.elastic.rendezvous`` is first imported, calling the entry point with no
arguments to get the handler's creator. With ptl-resiliency installed, ``torchrun --rdzv-backend
ft-barrier`` therefore works without ``ft_launcher``.

This module imports nothing: it is loaded in the middle of torch's own package import (where
:mod:`launcher.rendezvous.barrier`, which imports that package, cannot be), and in every process
of the environment that imports torch's rendezvous. The creator imports the handler only when a
job asks for ``ft-barrier``. :func:`register` registers this same creator where no entry point
was loaded, since torch's registry refuses a second, different creator for one name (the
handler's module does not import this one: only this one imports it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters


def create_ft_barrier_handler(params: RendezvousParameters) -> RendezvousHandler:
    """The ``ft-barrier`` handler for ``params`` (see :func:`launcher.rendezvous.barrier.create_handler`)."""
    from launcher.rendezvous.barrier import create_handler

    return create_handler(params)


def torchrun_handler() -> Callable[[Any], RendezvousHandler]:
    """What the ``torchrun.handlers`` entry point ``ft-barrier`` gives torch's registry: the creator."""
    return create_ft_barrier_handler


def register() -> None:
    """Register ``ft-barrier`` in torch's rendezvous handler registry.

    Safe to call again, or after torch loaded the package's ``torchrun.handlers`` entry point: the
    creator is the same object, which the registry accepts.
    """
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    from launcher.rendezvous.barrier import BACKEND

    rendezvous_handler_registry.register(BACKEND, create_ft_barrier_handler)
