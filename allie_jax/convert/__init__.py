"""Weight converters into AllieModel parameters: OpenAI GPT-2 (HF safetensors) and the released Allie."""

from allie_jax.convert.allie_torch import convert_released_allie, released_to_params
from allie_jax.convert.gpt2 import ConversionError, convert_gpt2, gpt2_to_params

__all__ = [
    "ConversionError",
    "convert_gpt2",
    "convert_released_allie",
    "gpt2_to_params",
    "released_to_params",
]
