"""Defaults shared by every training config; each named config overrides what differs."""

from __future__ import annotations

import ml_collections

from allie_jax.model import decoder_family


def base_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()

    # One entry per ModelConfig field (unset = the named size's value), plus:
    #   name: a ModelConfig.named() size; dtype: computation dtype (parameters stay float32);
    #   init_from_gpt2: an OpenAI GPT-2 model.safetensors to start from (SPEC §2), or "" /
    #     "scratch" for random init (paper-size configs leave it unset: the run then asks);
    #   attention_impl: auto (cuDNN flash on GPU in bf16, Pallas splash on TPU, XLA on CPU) |
    #     xla | cudnn | splash;  remat: none | dots_saveable | full;
    #   scan_layers: layers as one scanned block (compiles a deep model like one layer);
    #   max_segments_per_row: game pieces + padding run per packed row that the cuDNN kernel's
    #     static layout holds (the pipeline packs at most one fewer games per row);
    #   embd_pdrop / resid_pdrop / attn_pdrop: GPT-2's dropout placement (unset: dropout,
    #     dropout, 0.0; attention dropout needs the XLA kernel).
    config.model = decoder_family.model_section(
        name="tiny",
        dtype="float32",
        dropout=0.1,
        init_from_gpt2="",
        attention_impl="auto",
        remat="none",
        scan_layers=False,
        max_segments_per_row=32,
    )

    config.data = ml_collections.ConfigDict()
    config.data.data_dir = ""  # output of `python -m launch.prepare_data`
    config.data.seq_len = 512
    config.data.augment = True
    config.data.seed = 0
    config.data.worker_count = 0  # grain worker processes per host (0: in the training process)
    config.data.worker_buffer_size = 1  # batches each worker keeps ready
    config.data.device_prefetch = 1  # batches put on the devices ahead of the step

    config.train = ml_collections.ConfigDict()
    config.train.seed = 0
    config.train.steps = 1000
    config.train.batch_size = 16  # rows of seq_len tokens per optimizer step (global)
    config.train.grad_accum = 1  # micro-batches per step; batch_size must divide by it
    config.train.learning_rate = 6e-4
    config.train.min_learning_rate = 1e-5
    config.train.warmup_steps = 100
    config.train.decay_steps = 0  # cosine length; 0 = train.steps
    config.train.b1 = 0.9
    config.train.b2 = 0.95
    config.train.weight_decay = 0.01  # on matrices only
    config.train.grad_clip = 1.0
    config.train.loss_weights = (1.0, 1.0, 1.0)  # policy, time, value

    config.train.log_every = 10
    config.train.eval_every = 200
    config.train.eval_batches = 8
    config.train.checkpoint_every = 200
    config.train.keep_checkpoints = 3
    config.train.async_checkpoints = True
    # On resume, restore the data iterators too (exact resume). A checkpoint written by a
    # different process count cannot: set False to restart the data stream with a fresh shuffle.
    config.train.restore_data_iterator = True

    # Mesh axes (data, fsdp, tensor); -1 takes the remaining devices.
    config.mesh = ml_collections.ConfigDict()
    config.mesh.data = -1
    config.mesh.fsdp = 1
    config.mesh.tensor = 1
    # Slices (DCN) along each axis; the product > 1 builds a hybrid ICI x DCN mesh where each
    # slice holds data x fsdp x tensor devices (put data parallelism across slices).
    config.mesh.dcn_data = 1
    config.mesh.dcn_fsdp = 1
    config.mesh.dcn_tensor = 1

    config.distributed = ml_collections.ConfigDict()
    # "auto": call jax.distributed.initialize() when the environment names a multi-process job
    # (train/distributed.py lists the variables); True / False force it. Any type: a bool or "auto".
    config.distributed.initialize = ml_collections.FieldReference("auto", field_type=object)
    config.distributed.coordinator_address = ""
    config.distributed.num_processes = 0
    config.distributed.process_id = -1
    config.distributed.cpu_collectives = ""  # "gloo" for multi-process CPU runs (tests)
    return config
