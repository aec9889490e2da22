"""Train with ``pytorch_lightning`` while ``lightning`` cannot be imported, as on a machine where
only the standalone package is installed: ``python lightning_standalone_pl.py ROOT``.

Prints one JSON line: the Lightning package ptl_resiliency picked, and the global step reached.
"""

import importlib.abc
import json
import sys


class _BlockLightning(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "lightning" or name.startswith("lightning."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None


def main() -> int:
    sys.meta_path.insert(0, _BlockLightning())
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.demos.boring_classes import BoringModel

    from ptl_resiliency import FaultToleranceCallback
    from ptl_resiliency._lightning import pl as chosen

    torch.set_num_threads(1)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=3, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, limit_val_batches=0,
        default_root_dir=sys.argv[1],
        callbacks=[FaultToleranceCallback(autoresume=True, calculate_timeouts=False)],
    )
    trainer.fit(BoringModel())
    print(json.dumps({"package": chosen.__name__, "global_step": trainer.global_step,
                      "lightning_imported": "lightning" in sys.modules}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
