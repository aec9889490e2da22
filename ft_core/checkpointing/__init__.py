"""Checkpointing helpers; :mod:`ft_core.checkpointing.local` holds node-local checkpoints."""
