"""moh_torch: the MoH toolkit's ops for PyTorch.

    torch.ops.moh.*       the ops (loaded on import): MoH attention (dense and sparse paths), the router, the DiT-block
                          ops; each with CPU and CUDA kernels, a fake implementation and autograd
    moh_torch.functional  the same with defaults and named results
    moh_torch.nn          drop-in modules with the official state_dict keys; from_module / swap_attention
    moh_torch.metrics     the FID / sFID / IS / precision / recall / KID report of `moh fid`
"""
from . import _ops  # noqa: F401  (registers torch.ops.moh)
from . import functional, metrics, nn  # noqa: F401

__version__ = "0.1.0"
