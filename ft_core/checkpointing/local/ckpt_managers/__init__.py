"""Local checkpoint managers: the abstract :class:`BaseCheckpointManager` and :class:`LocalCheckpointManager`."""
