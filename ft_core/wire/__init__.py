"""What every runtime of ft_core shares: the wire format, the config, names and OS helpers.

The rank side (:mod:`ft_core.client`), the stdlib-only rank monitor (:mod:`ft_core.monitor`) and
the launcher all import from here, so everything in this package is standard-library only and
imports no other ft_core package.
"""
