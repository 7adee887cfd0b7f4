"""Sharded training equals single-device training: 8 fake CPU devices, three mesh shapes.

Runs in a subprocess because the fake device count must be fixed before JAX starts.
"""

from __future__ import annotations

import textwrap

from tests.support.fake_devices import run_on_eight_devices

WORKER = textwrap.dedent(
    r"""
    import json, sys
    import jax, numpy as np
    from allie_jax.pgn import read_games
    from allie_jax.train import sharding as shd
    from allie_jax.train.loop import build_trainer, model_config_from
    from configs.tiny import get_config
    from tests.support.game_batches import game_rows

    SEQ, ROWS, STEPS = 64, 8, 5
    games = [g for _, g in zip(range(ROWS * STEPS), read_games(sys.argv[1]))]
    batches = [game_rows(games[s * ROWS:(s + 1) * ROWS], SEQ) for s in range(STEPS)]

    config = get_config()
    config.train.batch_size = ROWS
    config.model.dropout = 0.1  # dropout on: its RNG must not depend on the sharding either
    results = {}
    for shape in [(1, 1, 1), (8, 1, 1), (2, 4, 1), (2, 2, 2)]:
        n = int(np.prod(shape))
        mesh = shd.make_mesh(shape, jax.devices()[:n])
        trainer = build_trainer(config, model_config_from(config), mesh)
        state = trainer.state
        for b in batches:
            state, metrics = trainer.train_step(state, jax.device_put(b, trainer.batch_sharding))
        leaves = [np.asarray(x) for x in jax.tree.leaves(state.params)]
        sharded = sum(1 for x in jax.tree.leaves(state.params) if not x.sharding.is_fully_replicated)
        results[str(shape)] = (leaves, float(metrics["loss"]), sharded)
    ref, ref_loss, _ = results["(1, 1, 1)"]
    out = {}
    for key, (leaves, loss, sharded) in results.items():
        diff = max(float(np.max(np.abs(a - b))) for a, b in zip(leaves, ref))
        out[key] = {"max_abs_diff": diff, "loss": loss, "sharded_leaves": sharded}
    print("RESULT" + json.dumps(out))
    """
)


def test_sharded_training_matches_single_device(sample_pgn):
    results = run_on_eight_devices(WORKER, str(sample_pgn), timeout=600)
    for shape in ["(8, 1, 1)", "(2, 4, 1)", "(2, 2, 2)"]:
        assert results[shape]["max_abs_diff"] < 1e-5, (shape, results[shape])
    # The fsdp/tensor meshes really shard parameters (not a silently replicated run).
    assert results["(2, 4, 1)"]["sharded_leaves"] > 0
    assert results["(2, 2, 2)"]["sharded_leaves"] > 0
