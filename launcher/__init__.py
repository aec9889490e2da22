"""``ft_launcher``: torchrun with fault tolerance (see :mod:`launcher.cli`)."""


def get_args_parser():  # noqa: ANN201 - re-exported lazily to keep `import launcher` light
    """The complete ``ft_launcher`` argument parser (torchrun's plus fault tolerance options)."""
    from launcher.cli import get_args_parser as _get_args_parser

    return _get_args_parser()


__all__ = ["get_args_parser"]
