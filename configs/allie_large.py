"""GPT-2 large shape (774M): parameters and optimizer state sharded over `fsdp`.

Replicated, the float32 state alone (parameters, gradients, Adam's two moments: 12.4 GB) would
leave a 16 GiB v5e chip no room; sharded over the slice's `fsdp` axis it fits with ``remat=full``
(inherited from ``allie_medium``), which the measured table chose (bench/RESULTS.md, "what fits
where"), e.g.

    .venv-tpu/bin/python -m launch.compile_check --config configs/allie_large.py --topology v5e-16
"""

from configs.allie_medium import get_config as medium_config


def get_config():
    config = medium_config()
    config.model.name = "allie_large"
    config.model.scan_layers = True  # 36 layers, one scanned block (as allie_medium)
    config.mesh.data = 1
    config.mesh.fsdp = -1
    return config
