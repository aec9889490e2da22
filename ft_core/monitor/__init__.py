"""The rank monitor: one stdlib-only side process per rank that finds hangs and stops the rank.

This package imports only the standard library and :mod:`ft_core.wire`, never torch and never
:mod:`ft_core.client` (``tests/unit/test_layout.py`` checks it with torch blocked). The
launcher's handles on a monitor (:mod:`ft_core.monitor.process`, :mod:`ft_core.monitor.link`)
live here too, next to the process they talk to.
"""
