"""A PyTorch model with the released Allie's structure and key names, for same-run comparisons.

The released model (y0mingzhang/allie) is ``CausalLMWithRegressionHead(CausalLMWithControlToken(
GPT2LMHeadModel))``: Elo ids (``elo + 1997``) replace the token embedding by
``[a, 1 − a] @ control_embeds`` (a = the Elo clamped to [500, 3000], scaled to [0, 1]), GPT-2 adds
positions, and the value (tanh) / time heads read the final hidden state. This module is written
here from that description and is the one clone: tests/test_convert.py checks our converter
and forward pass against it, the benchmarks time it. Its ``state_dict`` uses the
released key names, so ``allie_jax.convert.convert_released_allie`` turns it into our model with
the same weights. Needs the ``torch`` extra.
"""

from __future__ import annotations

import pathlib
import tempfile

import torch
import transformers

from allie_jax.convert import convert_released_allie
from allie_jax.model import ModelConfig

RELEASED_VOCAB = 1997  # token rows of the released wte (moves + special tokens)


class ControlToken(torch.nn.Module):
    """``CausalLMWithControlToken``: Elo ids embedded from two control vectors."""

    def __init__(self, model: transformers.GPT2LMHeadModel):
        super().__init__()
        self.model = model
        self.vocab_size = model.transformer.wte.num_embeddings
        self.control_embeds = torch.nn.Embedding(2, model.config.n_embd)
        self.control_embeds.weight.data.normal_(mean=0.0, std=0.02)
        self.elo_min, self.elo_max = 500, 3000

    def forward(self, input_ids, attention_mask=None):
        elo_mask = (input_ids >= self.vocab_size).unsqueeze(-1)
        elo = ((input_ids - self.vocab_size).clamp(self.elo_min, self.elo_max) - self.elo_min) / (
            self.elo_max - self.elo_min
        )
        control = torch.stack((elo, 1 - elo), dim=2).to(self.control_embeds.weight.dtype)
        control = control @ self.control_embeds.weight
        tokens = self.model.transformer.wte(input_ids.clamp(0, self.vocab_size - 1))
        inputs_embeds = torch.where(elo_mask, control, tokens)
        return self.model(
            inputs_embeds=inputs_embeds, attention_mask=attention_mask, output_hidden_states=True
        )


class RegressionHead(torch.nn.Module):
    """``CausalLMWithRegressionHead`` (inference): logits, value (tanh) and time per position."""

    def __init__(self, model: ControlToken):
        super().__init__()
        self.model = model
        d = model.model.config.n_embd
        self.value_head = torch.nn.Sequential(
            torch.nn.Linear(d, 1), torch.nn.Flatten(start_dim=1), torch.nn.Tanh()
        )
        self.time_head = torch.nn.Sequential(torch.nn.Linear(d, 1), torch.nn.Flatten(start_dim=1))

    def forward(self, input_ids, attention_mask=None):
        out = self.model(input_ids, attention_mask=attention_mask)
        last = out.hidden_states[-1]
        return out.logits, self.value_head(last), self.time_head(last)


def released_like(config: ModelConfig, seed: int = 0) -> RegressionHead:
    """A randomly initialised released-structure model of our config's shape (eval mode)."""
    torch.manual_seed(seed)
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            vocab_size=RELEASED_VOCAB,
            n_positions=config.max_len,
            n_embd=config.embed_dim,
            n_layer=config.num_layers,
            n_head=config.num_heads,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            activation_function="gelu_new",
            layer_norm_epsilon=1e-5,
        )
    )
    return RegressionHead(ControlToken(gpt2)).eval()


def paired_models(size: str | ModelConfig, seed: int = 0):
    """(torch model, our AllieModel) with the same weights: saved as a released ``best.pt`` and
    converted by our converter. ``size``: a named size or a config."""
    config = size if isinstance(size, ModelConfig) else ModelConfig.named(size, dropout=0.0)
    torch_model = released_like(config, seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "best.pt"
        torch.save({"model": torch_model.state_dict()}, path)
        ours = convert_released_allie(path, config=config)
    return torch_model, ours
