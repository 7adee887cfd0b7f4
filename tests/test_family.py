"""The model-family registry: every field reachable from flags, unused settings refused, no
family switch outside the families' own modules."""

from __future__ import annotations

import dataclasses
import pathlib
import re

import pytest
from absl import flags
from ml_collections import config_flags

from allie_jax.model import family as family_lib
from allie_jax.model.board_transformer import BoardConfig
from allie_jax.model.config import ModelConfig

REPO = pathlib.Path(__file__).resolve().parents[1]

# A valid non-default value for every field (checked against the dataclass below).
DECODER_VALUES = {
    "vocab_size": 2001,
    "num_layers": 3,
    "embed_dim": 96,
    "num_heads": 8,
    "mlp_dim": 200,
    "max_len": 256,
    "dropout": 0.25,
    "layer_norm_eps": 1e-6,
    "dtype": "bfloat16",
    "param_dtype": "bfloat16",
    "attention_impl": "xla",
    "remat": "full",
    "max_segments_per_row": 8,
    "embd_pdrop": 0.05,
    "resid_pdrop": 0.15,
    "attn_pdrop": 0.02,
    "scan_layers": True,
}
BOARD_VALUES = {
    "num_layers": 3,
    "embed_dim": 96,
    "num_heads": 4,
    "mlp_ratio": 2,
    "layer_norm_eps": 1e-6,
    "param_dtype": "bfloat16",
    "attention_impl": "cudnn",
    "remat": True,
    "piece_scheme": "9_add",
    "flip": True,
    "mask_illegal": False,
    "refinement": False,
    "halfmove_degree": 8,
    "use_elo": False,
    "feedback_cycles": 2,
    "feedback_from": 1,
    "feedback_to": 2,
}


def parse(config_file: str, *overrides: str):
    argv = ["train", f"--config={REPO / 'configs' / config_file}", *overrides]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, sys_argv=argv)
    values(argv)
    return values.config


def test_registry_names_and_lookup():
    assert set(family_lib.names()) == {"allie", "board", "maia"}
    for name in family_lib.names():
        family = family_lib.get(name)
        assert isinstance(family, family_lib.ModelFamily) and family.name == name
    with pytest.raises(family_lib.FamilyError, match="unknown model family 'nope'"):
        family_lib.get("nope")


def test_tables_cover_every_field():
    """The value tables below name every field, so a new field must be made reachable."""
    assert set(DECODER_VALUES) == {f.name for f in dataclasses.fields(ModelConfig)}
    shared = {"family", "dtype", "dropout"}
    assert set(BOARD_VALUES) == {f.name for f in dataclasses.fields(BoardConfig)} - shared


@pytest.mark.parametrize("field", sorted(DECODER_VALUES))
def test_every_decoder_field_is_reachable_from_a_flag(field):
    value = DECODER_VALUES[field]
    config = parse("tiny.py", f"--config.model.{field}={value}")
    model_config = family_lib.of_config(config).model_config(config)
    assert getattr(model_config, field) == value


@pytest.mark.parametrize("field", sorted(BOARD_VALUES))
def test_every_board_field_is_reachable_from_a_flag(field):
    value = BOARD_VALUES[field]
    config = parse("board_tiny.py", f"--config.model.board.{field}={value}")
    model_config = family_lib.of_config(config).model_config(config)
    assert getattr(model_config, field) == value


def test_board_shared_fields_and_defaults():
    config = parse("board_tiny.py", "--config.model.dtype=bfloat16", "--config.model.dropout=0.3")
    got = family_lib.of_config(config).model_config(config)
    assert (got.dtype, got.dropout) == ("bfloat16", 0.3)
    assert got == BoardConfig.named("board_tiny", dtype="bfloat16", dropout=0.3)


def test_a_setting_no_family_reads_is_an_error():
    # A decoder setting on a board config was silently ignored; a flag for it now has no key.
    with pytest.raises(Exception, match="remat"):
        parse("board_tiny.py", "--config.model.remat=full")
    config = parse("board_tiny.py")
    with config.unlocked():
        config.model.remat = "full"  # a Python config adding it by hand
    with pytest.raises(
        family_lib.FamilyError, match=r"config.model.remat: not a setting of the 'board'"
    ):
        family_lib.of_config(config).model_config(config)
    decoder = parse("tiny.py")
    with decoder.unlocked():
        decoder.model.mlp_ratio = 4  # a board field on the decoder
    with pytest.raises(family_lib.FamilyError, match=r"config.model.mlp_ratio: not a setting"):
        family_lib.of_config(decoder).model_config(decoder)


def test_loss_weights_must_match_the_family():
    config = parse("board_tiny.py", "--config.train.loss_weights=(1.0, 1.0, 1.0)")
    with pytest.raises(family_lib.FamilyError, match="needs 4 weights"):
        family_lib.check_loss_weights(config, family_lib.of_config(config))
    assert family_lib.check_loss_weights(parse("tiny.py"), family_lib.get("allie")) == (1.0,) * 3


def test_maia_is_inference_only_and_says_so():
    from allie_jax.baselines.maia import MaiaConfig

    maia = family_lib.get("maia")
    assert family_lib.of_model_config(MaiaConfig()) is maia
    assert maia.config_from_dict({"family": "maia", "blocks": 6}) == MaiaConfig()
    with pytest.raises(family_lib.FamilyError, match="inference only"):
        maia.data_iterator(None, "train")


def test_no_family_switch_in_the_shared_code():
    """The trainer, programs and checkpoints call the family interface, never a family by name."""
    for path in (
        "allie_jax/train/loop.py",
        "allie_jax/train/programs.py",
        "allie_jax/model/checkpoint.py",
        "allie_jax/train/validation.py",
    ):
        text = (REPO / path).read_text()
        for word in (r"\bboard\b", r"\bmaia\b", r"is_board", r"AllieModel\(", r"BoardTransformer"):
            assert not re.search(word, text), f"{path} names {word!r}"
