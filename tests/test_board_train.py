"""The board family through the shared trainer (``model.family = "board"``) and its loss."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from allie_jax.data import board_features as bf
from allie_jax.model.board_family import board_loss, model_inputs
from allie_jax.model.board_transformer import BoardConfig, BoardTransformer
from allie_jax.pgn import read_games


def test_loss_trains_refinement_end_to_end(sample_pgn):
    games = [g for g in itertools.islice(read_games(sample_pgn), 30) if len(g.moves) > 30][:2]
    batch = bf.stack([e for g in games for e in bf.game_examples(g)][:32])
    model = BoardTransformer(BoardConfig.named("board_tiny", num_layers=2), rngs=nnx.Rngs(0))

    @nnx.jit
    def grads_and_metrics(model, batch):
        def loss(model):
            return board_loss(model(model_inputs(batch)), batch)

        (_, metrics), grads = nnx.value_and_grad(loss, has_aux=True)(model)
        return grads, metrics

    grads, metrics = grads_and_metrics(model, {k: jnp.asarray(v) for k, v in batch.items()})
    norm = lambda g: float(jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree.leaves(g))))  # noqa: E731
    assert metrics["top3_rate"] > 0  # some human moves are among the candidates
    assert norm(grads.choice_head) > 0 and norm(grads.uci) > 0 and norm(grads.prob_scale) > 0
    assert norm(grads.rights_head) > 0 and norm(grads.value_head) > 0
    assert norm(grads.blocks[0]) > 0
    for k in ("policy_loss", "choice_loss", "rights_loss", "value_loss"):
        assert np.isfinite(float(metrics[k])), k
    with pytest.raises(ValueError, match="policy, choice, rights, value"):
        board_loss(None, batch, (1.0, 1.0, 1.0))


@pytest.mark.slow
def test_launch_train_board_family(prepared_sample, tmp_path):
    from allie_jax.model.checkpoint import load_model
    from allie_jax.train import train_and_evaluate
    from configs import board_tiny

    config = board_tiny.get_config()
    config.data.data_dir = str(prepared_sample)
    config.model.board.num_layers = 2
    config.train.steps = 12
    config.train.batch_size = 32
    config.train.warmup_steps = 2
    config.train.eval_every = 12
    config.train.eval_batches = 2
    config.train.checkpoint_every = 12
    config.data.shuffle_window = 256
    result = train_and_evaluate(config, tmp_path)
    assert result.final_step == 12
    assert np.isfinite(result.first_loss) and np.isfinite(result.last_loss)
    assert {"policy_accuracy", "pass1_accuracy", "choice_loss"} <= set(result.val_metrics)
    model = load_model(tmp_path)
    assert isinstance(model, BoardTransformer)
    assert model.config == BoardConfig.named("board_tiny", num_layers=2)
