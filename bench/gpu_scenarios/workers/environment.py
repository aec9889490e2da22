"""Prints what the GPU check needs to know about this interpreter's torch as one JSON line."""

import json

try:
    import torch
except ImportError as exc:
    print(json.dumps({"torch": None, "cuda": False, "reason": f"torch does not import: {exc}"}))
    raise SystemExit(0) from None
info = {"torch": torch.__version__, "cuda": torch.cuda.is_available(), "devices": [], "nccl": None, "reason": ""}
if not info["cuda"]:
    info["reason"] = ("torch " + torch.__version__ + " was built without CUDA" if torch.version.cuda is None
                      else "torch sees no CUDA device")
else:
    info["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    info["cuda_version"] = torch.version.cuda
    try:
        info["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
    except Exception as exc:  # no NCCL in this build: the NCCL scenarios fail and say so
        info["nccl"] = f"unavailable ({exc})"
try:
    import lightning
    info["lightning"] = lightning.__version__
except ImportError:
    info["lightning"] = None
print(json.dumps(info))
