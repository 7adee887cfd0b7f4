"""The Allie network (Flax NNX): config, model, KV cache, loss and checkpoints."""

from allie_jax.model.config import NAMED_SIZES, ModelConfig
from allie_jax.model.kv_cache import KVCache
from allie_jax.model.transformer import AllieModel, ModelOutputs, count_params

__all__ = ["NAMED_SIZES", "AllieModel", "KVCache", "ModelConfig", "ModelOutputs", "count_params"]
