"""Module state that must be fresh in every worker (see warm_probe.py)."""

imports: list = []
