"""Gradient accumulation on a data-parallel mesh: strided micro-batches move no activations, and
two micro-batches give the same step as one pass over the batch.

Runs on 8 fake CPU devices in a subprocess (the device count is fixed before JAX starts). The
compiled step's HLO is read for collectives; the contiguous split the step used before is
compiled too, so the count is known to catch the resharding it caused.
"""

from __future__ import annotations

import textwrap

from tests.support.fake_devices import run_on_eight_devices

WORKER = textwrap.dedent(
    r"""
    import json, re, sys
    import jax, numpy as np
    from allie_jax.pgn import read_games
    from allie_jax.train import sharding as shd, step as step_module
    from allie_jax.train.loop import build_trainer, model_config_from
    from configs.tiny import get_config
    from tests.support.game_batches import game_rows

    SEQ, ROWS = 64, 16
    games = [g for _, g in zip(range(3 * ROWS), read_games(sys.argv[1]))]
    # rows of different lengths, so the micro-batches hold different label counts
    b = game_rows(games[:ROWS], SEQ, [SEQ if i % 3 else SEQ // 2 for i in range(ROWS)])

    def collectives(text):
        return {kind: len(re.findall(r"\b%s(?:-start)?\(" % kind, text))
                for kind in ("all-gather", "collective-permute", "all-reduce", "all-to-all")}

    config = get_config()
    config.train.batch_size = ROWS
    config.model.dropout = 0.0  # dropout draws depend on the micro-batch shapes
    mesh = shd.make_mesh((8, 1, 1), jax.devices())
    out = {}
    for name, accum in (("one_pass", 1), ("strided", 2), ("contiguous", 2)):
        if name == "contiguous":  # the split before: rows [0, B/2) first
            step_module.strided_micro_batches = lambda batch, k: jax.tree.map(
                lambda x: x.reshape((k, x.shape[0] // k) + x.shape[1:]), batch)
        config.train.grad_accum = accum
        trainer = build_trainer(config, model_config_from(config), mesh)
        batch = jax.device_put(b, trainer.batch_sharding)
        text = trainer.train_step.lower(trainer.state, batch).compile().as_text()
        state, metrics = trainer.train_step(trainer.state, batch)
        out[name] = {
            "collectives": collectives(text),
            "loss": float(metrics["loss"]),
            "params": [np.asarray(x).tolist() for x in jax.tree.leaves(state.params)],
            "micro_rows": [int(x) for x in np.asarray(b["policy_mask"].sum(1))],
        }
    ref = out["one_pass"]["params"]
    for name in ("strided", "contiguous"):
        out[name]["max_abs_diff"] = max(
            float(np.max(np.abs(np.asarray(a) - np.asarray(r))))
            for a, r in zip(out[name]["params"], ref))
    for v in out.values():
        del v["params"]
    print("RESULT" + json.dumps(out))
    """
)


def test_strided_micro_batches_move_no_activations_and_equal_one_pass(sample_pgn):
    r = run_on_eight_devices(WORKER, str(sample_pgn), timeout=600)
    strided, contiguous = r["strided"]["collectives"], r["contiguous"]["collectives"]
    assert strided["all-gather"] == 0 and strided["collective-permute"] == 0, strided
    assert strided["all-reduce"] > 0  # the gradients are still summed over the data axis
    # The contiguous split resharded every micro-batch (what this test exists to catch).
    assert contiguous["all-gather"] + contiguous["collective-permute"] > 0, contiguous
    # Label counts differ between micro-batches, yet two strided micro-batches are one pass.
    assert abs(r["strided"]["loss"] - r["one_pass"]["loss"]) < 1e-5, r
    assert r["strided"]["max_abs_diff"] < 1e-6, r["strided"]["max_abs_diff"]
