"""The training input path: grain worker processes resume exactly; the device feed saves the
data state of the batches the steps consumed (not of the batch fetched ahead)."""

from __future__ import annotations

import numpy as np

from allie_jax.data.pipeline import make_iterator


def _equal(a, b) -> bool:
    return all(np.array_equal(x[k], y[k]) for x, y in zip(a, b, strict=True) for k in x)


def test_worker_processes_resume_exactly(prepared_sample):
    kwargs = dict(batch_size=4, seq_len=128, worker_count=2)
    it = make_iterator(prepared_sample, "train", **kwargs)
    try:
        for _ in range(3):
            next(it)
        state = it.get_state()
        expected = [next(it) for _ in range(4)]
    finally:
        it.close()
    again = make_iterator(prepared_sample, "train", **kwargs)
    try:
        again.set_state(state)
        got = [next(again) for _ in range(4)]
    finally:
        again.close()
    assert _equal(expected, got)
    assert expected[0]["inputs"].shape == (4, 128)
