"""How the nodes meet: rendezvous backends and the launchers' keys in the rendezvous store.

This package's ``__init__`` imports nothing: :mod:`launcher.rendezvous.plugin` is loaded by
torch's rendezvous registry in the middle of torch's own package import.

- :mod:`launcher.rendezvous.barrier`: the ``ft-barrier`` backend (O(1) store operations per node);
- :mod:`launcher.rendezvous.plugin`: its ``torchrun.handlers`` entry point for plain torchrun;
- :mod:`launcher.rendezvous.membership`: which waiting nodes make the agent restart (spares);
- :mod:`launcher.rendezvous.round_failure`: a round that closed counting a dead node is a restart;
- :mod:`launcher.rendezvous.own_connection`: a second store connection (ft-barrier's keep-alive);
- :mod:`launcher.rendezvous.poll`: how often a node waiting in torch's c10d rendezvous polls;
- :mod:`launcher.rendezvous.store_channel`: the nodes' views of a failure and marks in the store;
- :mod:`launcher.rendezvous.store_counter`: a debug counter of store operations per phase;
- :mod:`launcher.rendezvous.store_watchdog`: ends the launcher when the store's host is gone;
- :mod:`launcher.rendezvous.master_port`: the port rank 0's worker listens on for its store.
"""
