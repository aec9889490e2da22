"""A user's own Lightning training script: no logging set-up at all, as people write them.

``python user_lightning_script.py RUN_DIR MAX_STEPS`` under ft_launcher (DDP on CPU, gloo). Used
to check what reaches the console by default (issue 14.4).
"""

import os
import sys

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.plugins.environments import TorchElasticEnvironment

from ptl_resiliency import FaultToleranceSectionsCallback

run_dir, max_steps = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)
trainer = Trainer(
    default_root_dir=run_dir, accelerator="cpu", strategy="ddp", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
    plugins=[TorchElasticEnvironment()], max_steps=max_steps, logger=False, enable_progress_bar=False,
    enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
    callbacks=[
        FaultToleranceSectionsCallback(autoresume=True, calculate_timeouts=True, exp_dir=run_dir),
        ModelCheckpoint(dirpath=os.path.join(run_dir, "ckpt"), every_n_train_steps=10, save_last=True),
    ],
)
trainer.fit(BoringModel())
# As PyTorch asks: a gloo group still alive at interpreter exit can abort the process (SIGABRT).
torch.distributed.destroy_process_group()
