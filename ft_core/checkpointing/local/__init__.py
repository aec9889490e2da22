"""Node-local checkpoints, each rank's replicated to a rank on another node (see docs/local-checkpoints.md).

The module paths are the reference's (``nvidia_resiliency_ext.checkpointing.local``):
:mod:`~ft_core.checkpointing.local.ckpt_managers.local_manager` (``LocalCheckpointManager``),
:mod:`~ft_core.checkpointing.local.replication.strategies` (``CliqueReplicationStrategy``,
``LazyCliqueReplicationStrategy``), :mod:`~ft_core.checkpointing.local.basic_state_dict`
(``BasicTensorAwareStateDict``). The on-disk format is :mod:`~ft_core.checkpointing.local.files`.
"""
