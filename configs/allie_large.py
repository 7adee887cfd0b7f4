"""GPT-2 large shape (774M): shard parameters over `fsdp` to fit optimizer state."""

from configs.allie_medium import get_config as medium_config


def get_config():
    config = medium_config()
    config.model.name = "allie_large"
    config.model.scan_layers = True  # 36 layers, one scanned block (as allie_medium)
    config.mesh.data = 1
    config.mesh.fsdp = -1
    return config
