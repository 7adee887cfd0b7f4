"""Model hyper-parameters: one frozen dataclass, JSON round-trippable, with the paper's named sizes.

The GPT-2 sizes keep GPT-2's 1,024 learned positions (``max_len``) even though games are at most
512 tokens: the released Allie kept them, and its parameter count (305.4M for ``allie_medium``)
only adds up with 1,024 rows, so its checkpoint only loads with them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, ClassVar

import jax.numpy as jnp

from allie_jax import vocab

ATTENTION_IMPLS = ("auto", "xla", "cudnn", "splash")
REMAT_POLICIES = ("none", "dots_saveable", "full")
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


class NamedConfig:
    """Named sizes and the JSON round trip, shared by every model family's frozen config.

    A subclass sets ``named_sizes`` (its size table) and ``size_kind`` (the word its errors use);
    one copy of these rules keeps the families' checkpoints and error messages from drifting.
    """

    named_sizes: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    size_kind: ClassVar[str] = "model"

    @classmethod
    def named(cls, name: str, **overrides: Any):
        """A named size plus overrides."""
        try:
            base = cls.named_sizes[name]
        except KeyError:
            raise ValueError(
                f"unknown {cls.size_kind} size {name!r}; expected one of {sorted(cls.named_sizes)}"
            ) from None
        return cls(**{**base, **overrides})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown {cls.__name__} fields: {sorted(unknown)}")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


@dataclasses.dataclass(frozen=True)
class ModelConfig(NamedConfig):
    """A GPT-2 decoder with Allie's soft Elo tokens and value / time heads."""

    vocab_size: int = vocab.VOCAB_SIZE  # 1997 rows; ids >= vocab_size are Elo ratings
    num_layers: int = 2
    embed_dim: int = 64
    num_heads: int = 4
    mlp_dim: int | None = None  # None: 4 × embed_dim, as GPT-2
    max_len: int = 512  # rows of the learned position table
    dropout: float = 0.1  # embedding and residual dropout (training only)
    layer_norm_eps: float = 1e-5
    dtype: str = "float32"  # computation dtype; "bfloat16" for accelerators
    param_dtype: str = "float32"
    # Whole-game attention kernel: auto (cuDNN flash on GPU in bf16/fp16, Pallas splash on TPU,
    # XLA elsewhere), or one of xla / cudnn / splash. None (older config.json files) = auto.
    attention_impl: str | None = "auto"
    # Activation memory: none, dots_saveable (keep matmul outputs, recompute the rest in the
    # backward pass), full (keep only each block's input). True/False (older files) = full/none.
    remat: str | bool = "none"
    # Segments (game pieces + the padding run) per packed row that the cuDNN kernel is compiled
    # for: its packed layout has a static width, and cuDNN keeps float32 softmax statistics for
    # every slot. The training pipeline packs at most ``max_segments_per_row - 1`` games per row;
    # a row with more comes out of the cuDNN kernel as NaN (the loss check stops the run).
    max_segments_per_row: int = 32
    # GPT-2's three dropout rates (the released trainer's placement): after the embeddings, on
    # the residual branches, and on the attention probabilities. None: ``dropout`` (embd/resid)
    # and 0.0 (attn). Attention dropout needs the XLA kernel (flash kernels have none here).
    embd_pdrop: float | None = None
    resid_pdrop: float | None = None
    attn_pdrop: float | None = None
    # Layer layout: False keeps one Block per layer (``blocks.{i}.*``); True keeps one Block whose
    # parameters carry a leading layer axis (``layers.*[i]``) and runs whole games as one
    # ``nnx.scan``, so a deep model compiles in about the time of one layer. Same outputs;
    # checkpoints of either layout load into the other (``model/layer_layout.py``).
    scan_layers: bool = False

    def __post_init__(self) -> None:
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}"
            )
        for field in ("dtype", "param_dtype"):
            if getattr(self, field) not in _DTYPES:
                raise ValueError(
                    f"{field}={getattr(self, field)!r}: expected one of {list(_DTYPES)}"
                )
        # Frozen: normalise the older spellings in place.
        if self.attention_impl is None:
            object.__setattr__(self, "attention_impl", "auto")
        if isinstance(self.remat, bool):
            object.__setattr__(self, "remat", "full" if self.remat else "none")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(
                f"attention_impl={self.attention_impl!r}: expected one of {ATTENTION_IMPLS}"
            )
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"remat={self.remat!r}: expected one of {REMAT_POLICIES}")
        if self.max_segments_per_row < 2:
            raise ValueError(
                f"max_segments_per_row={self.max_segments_per_row}: need at least 2 (a game and "
                "the padding run)"
            )
        for field in ("dropout", "embd_pdrop", "resid_pdrop", "attn_pdrop"):
            rate = getattr(self, field)
            if rate is not None and not 0.0 <= rate < 1.0:
                raise ValueError(f"{field}={rate!r}: expected a rate in [0, 1)")

    @property
    def embedding_dropout(self) -> float:
        return self.dropout if self.embd_pdrop is None else self.embd_pdrop

    @property
    def residual_dropout(self) -> float:
        return self.dropout if self.resid_pdrop is None else self.resid_pdrop

    @property
    def attention_dropout(self) -> float:
        return 0.0 if self.attn_pdrop is None else self.attn_pdrop

    def check_attention_dropout(self, backend: str) -> None:
        """Attention dropout runs in the XLA kernel only; say so before a run starts."""
        impl = self.resolved_attention_impl(backend)
        if self.attention_dropout > 0 and impl != "xla":
            raise ValueError(
                f"attn_pdrop={self.attention_dropout} needs attention_impl=xla (the {impl} "
                "kernel has no attention dropout here): pass --config.model.attention_impl=xla "
                "or --config.model.attn_pdrop=0"
            )

    def resolved_attention_impl(self, backend: str) -> str:
        """The kernel ``auto`` stands for on ``backend`` (``jax.default_backend()``).

        cuDNN's flash kernel only takes 16-bit inputs, so float32 runs on GPU use XLA.
        """
        if self.attention_impl != "auto":
            return self.attention_impl
        if backend in ("gpu", "cuda", "rocm") and self.dtype in ("bfloat16", "float16"):
            return "cudnn"
        if backend == "tpu":
            return "splash"
        return "xla"

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def hidden_dim(self) -> int:
        return self.mlp_dim or 4 * self.embed_dim

    @property
    def compute_dtype(self) -> Any:
        return _DTYPES[self.dtype]

    @property
    def parameter_dtype(self) -> Any:
        return _DTYPES[self.param_dtype]


NAMED_SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(num_layers=2, embed_dim=64, num_heads=4, max_len=512),
    "allie_124m": dict(num_layers=12, embed_dim=768, num_heads=12, max_len=1024),  # gpt2
    "allie_medium": dict(num_layers=24, embed_dim=1024, num_heads=16, max_len=1024),  # gpt2-medium
    "allie_large": dict(num_layers=36, embed_dim=1280, num_heads=20, max_len=1024),  # gpt2-large
}
ModelConfig.named_sizes = NAMED_SIZES  # tiny, allie_124m, allie_medium, allie_large
