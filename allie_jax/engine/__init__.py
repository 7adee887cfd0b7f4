"""Playing with Allie: the batched inference API, a UCI engine, and engine-vs-engine matches."""

from allie_jax.engine.api import Allie, Decision, Prediction

__all__ = ["Allie", "Decision", "Prediction"]
