"""Training on 8 fake CPU devices: padded validation, activation constraints, batch checks, and
the TPU attention kernel (interpret mode) run per device under the mesh.

One subprocess (the fake device count is fixed before JAX starts) runs every check and prints
its findings as JSON; the figures (constraint count) are printed for bench/RESULTS.md.
"""

from __future__ import annotations

import json
import textwrap

from tests.support.fake_devices import run_on_eight_devices

WORKER = textwrap.dedent(
    r"""
    import json, sys
    import jax, numpy as np
    from allie_jax.data.pipeline import make_iterator
    from allie_jax.model.transformer import AllieModel
    from allie_jax.model.losses import loss_fn
    from allie_jax.train import sharding as shd
    from allie_jax.train.feed import global_batch
    from allie_jax.train.loop import build_trainer, build_validator, model_config_from, validate_config
    from configs.tiny import get_config
    from flax import nnx

    data_dir = sys.argv[1]
    SEQ, ROWS = 64, 8
    config = get_config()
    config.data.data_dir = data_dir
    config.data.seq_len = SEQ
    config.model.dropout = 0.0
    config.train.batch_size = ROWS
    config.train.eval_batches = 1000  # the whole val split: its last batch is partial
    out = {}

    # Reference: every val batch as it comes (partial last one included) through the plain model.
    val = list(make_iterator(data_dir, "val", batch_size=ROWS, seq_len=SEQ, augment=False, num_epochs=1))
    out["val_rows"] = [len(b["inputs"]) for b in val]
    single = build_trainer(config, model_config_from(config), shd.make_mesh((1, 1, 1), jax.devices()[:1]))
    model = nnx.merge(single.graphdef, single.state.params, single.state.rest)
    forward = jax.jit(lambda b: loss_fn(model(b["inputs"], positions=b["positions"], segment_ids=b["segment_ids"]), b)[1])
    sums = {"policy_loss": 0.0, "time_loss": 0.0, "value_loss": 0.0, "policy_accuracy": 0.0}
    counts = {"policy_loss": 0.0, "time_loss": 0.0, "value_loss": 0.0, "policy_accuracy": 0.0}
    masks = {"policy_loss": "policy_mask", "time_loss": "time_mask", "value_loss": "value_mask", "policy_accuracy": "policy_mask"}
    for b in val:
        m = forward(b)
        for k in sums:
            n = float(np.sum(b[masks[k]]))
            sums[k] += float(m[k]) * n
            counts[k] += n
    ref = {k: sums[k] / counts[k] for k in sums}
    ref["loss"] = ref["policy_loss"] + ref["time_loss"] + ref["value_loss"]
    out["reference"] = ref

    for shape in [(8, 1, 1), (2, 2, 2)]:
        trainer = build_trainer(config, model_config_from(config), shd.make_mesh(shape))
        got = build_validator(config, trainer, ROWS)(trainer.state)
        out[str(shape)] = {"metrics": got, "eval_compilations": trainer.eval_step._cache_size()}

    # Activation sharding constraints in the lowered train step on (2, 2, 2).
    trainer = build_trainer(config, model_config_from(config), shd.make_mesh((2, 2, 2)))
    batch = global_batch(val[0], trainer.batch_sharding)
    text = trainer.train_step.lower(trainer.state, batch).as_text()
    out["constraints_222"] = text.count("sharding_constraint")  # Shardy's sdy.sharding_constraint
    # e.g. queries [batch, length, heads, head_dim]: batch over data x fsdp, heads over tensor.
    out["batch_split_constraints_222"] = text.count('[{"data", "fsdp"}, {}, {"tensor"}')

    # A batch the mesh's data x fsdp does not divide is refused before anything compiles.
    errors = []
    for batch_size, accum, mesh in [(12, 1, (-1, 1, 1)), (8, 2, (2, 4, 1)), (16, 1, (2, 4, 1))]:
        config.train.batch_size, config.train.grad_accum = batch_size, accum
        config.mesh.data, config.mesh.fsdp, config.mesh.tensor = mesh
        try:
            validate_config(config)
            errors.append(None)
        except ValueError as e:
            errors.append(str(e))
    out["validate"] = errors
    mesh = shd.mesh_from_config(config.mesh)
    out["mesh_from_config"] = [dict(mesh.shape), [str(t) for t in mesh.axis_types]]

    # The TPU kernel (Pallas splash, interpret mode) per device under shard_map on (2, 2, 2).
    import jax.numpy as jnp
    from allie_jax.model import attention as A, sharding as msh
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(4, 128, 4, 16)), jnp.float32) for _ in range(3))
    seg = np.ones((4, 128), np.int32); seg[0, 50:] = 2; seg[1, 100:] = 0
    mesh = shd.make_mesh((2, 2, 2))
    def splash(q, k, v, s):
        with msh.activation_sharding(mesh, shd.LOGICAL_AXIS_RULES):
            return A.splash_attention(q, k, v, s, interpret=True)
    diff = jax.jit(splash)(q, k, v, jnp.asarray(seg)) - A.xla_attention(q, k, v, jnp.asarray(seg))
    out["splash_222_max_diff"] = float(jnp.max(jnp.abs(diff)))
    print("RESULT" + json.dumps(out))
    """
)


def test_eight_device_validation_constraints_and_batch_checks(prepared_sample):
    out = run_on_eight_devices(WORKER, str(prepared_sample), timeout=900)
    print("\nSCALE:", json.dumps({k: v for k, v in out.items() if k != "reference"}))

    # The val split ends in a partial batch (the case that raised IndivisibleError).
    assert out["val_rows"][-1] < 8 and len(out["val_rows"]) >= 2
    for shape in ["(8, 1, 1)", "(2, 2, 2)"]:
        got = out[shape]
        assert got["eval_compilations"] == 1  # one fixed shape, one program
        for key, value in out["reference"].items():
            assert abs(got["metrics"][key] - value) < 2e-5, (shape, key, got["metrics"][key], value)

    assert out["constraints_222"] >= 20, out["constraints_222"]
    assert out["batch_split_constraints_222"] > 0

    too_small, accum, fits = out["validate"]
    assert too_small and "does not divide over the mesh's data x fsdp = 8 x 1" in too_small
    assert accum and "micro-batch" in accum  # 8 / 2 = 4 rows over 2 x 4 devices
    assert fits is None
    assert out["mesh_from_config"][0] == {"data": 2, "fsdp": 4, "tensor": 1}
    assert out["splash_222_max_diff"] < 1e-5
