"""Joining a multi-host job: ``jax.distributed`` starts by itself where the environment has a cluster.

A pod job that forgot ``--config.distributed.initialize=True`` used to run with the preemption
sync off: each host kept its own SIGTERM flag, stopped at its own step and waited forever in the
checkpoint barrier for the others (``preemption.py``). So ``config.distributed.initialize`` is
``"auto"`` by default: it initializes when the environment names a multi-process job, and a run
that has several processes but no preemption sync refuses to start, before anything compiles.

``detect_cluster`` mirrors JAX's own cluster detection (``jax._src.clusters``) through plain
environment reads, so it needs no private JAX API and can be tested with a dictionary:

- ``JAX_COORDINATOR_ADDRESS`` (non-empty): the job names its coordinator;
- SLURM: ``SLURM_JOB_ID``, ``SLURM_STEP_NODELIST``, ``SLURM_NTASKS``, ``SLURM_PROCID`` and
  ``SLURM_LOCALID`` all set (an ``srun`` step: JAX's condition) and ``SLURM_NTASKS`` > 1;
- Open MPI: ``OMPI_COMM_WORLD_SIZE`` > 1 (``mpirun``; JAX also needs ``OMPI_MCA_orte_hnp_uri``
  to find the coordinator, and says so if it is missing);
- Cloud TPU on GKE / multislice: ``TPU_PROCESS_ADDRESSES`` or ``TPU_WORKER_HOSTNAMES`` listing
  more than one host, ``MEGASCALE_COORDINATOR_ADDRESS`` set, or ``MEGASCALE_NUM_SLICES`` > 1.

A Cloud TPU VM pod created with ``gcloud`` keeps its worker list in the metadata server, not in
the environment; there the refusal catches it (``jax.process_count() > 1`` without the sync) and
names ``--config.distributed.initialize=True``. ``jax.distributed.initialize()`` itself then finds
the coordinator, process count and id from the same sources.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

import jax
import ml_collections

log = logging.getLogger(__name__)

FLAG = "--config.distributed.initialize"
AUTO = "auto"
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


@dataclasses.dataclass(frozen=True)
class Cluster:
    """A multi-process job found in the environment, and the variable that says so."""

    kind: str
    evidence: str  # e.g. "SLURM_NTASKS=4", shown in the log and in errors


def _count(env: Mapping[str, str], name: str) -> int:
    """An integer variable, 0 when unset or not a number (then it names no multi-process job)."""
    try:
        return int(env.get(name, "").strip() or 0)
    except ValueError:
        return 0


def detect_cluster(env: Mapping[str, str]) -> Cluster | None:
    """The multi-process job ``env`` describes, or None (a single process: nothing to join)."""
    if env.get("JAX_COORDINATOR_ADDRESS", "").strip():
        return Cluster("JAX", f"JAX_COORDINATOR_ADDRESS={env['JAX_COORDINATOR_ADDRESS'].strip()}")
    slurm = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
    if all(name in env for name in slurm) and _count(env, "SLURM_NTASKS") > 1:
        return Cluster("SLURM", f"SLURM_NTASKS={env['SLURM_NTASKS']}")
    if _count(env, "OMPI_COMM_WORLD_SIZE") > 1:
        return Cluster("Open MPI", f"OMPI_COMM_WORLD_SIZE={env['OMPI_COMM_WORLD_SIZE']}")
    for name in ("TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES"):
        hosts = [h for h in env.get(name, "").split(",") if h.strip()]
        if len(hosts) > 1:
            return Cluster("Cloud TPU", f"{name} lists {len(hosts)} hosts")
    if env.get("MEGASCALE_COORDINATOR_ADDRESS", "").strip():
        return Cluster("Cloud TPU multislice", "MEGASCALE_COORDINATOR_ADDRESS is set")
    if _count(env, "MEGASCALE_NUM_SLICES") > 1:
        return Cluster(
            "Cloud TPU multislice", f"MEGASCALE_NUM_SLICES={env['MEGASCALE_NUM_SLICES']}"
        )
    return None


def initialize_mode(value: Any) -> bool | None:
    """``config.distributed.initialize`` as True / False / None (auto); bad input: one line."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text == AUTO:
        return None
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{FLAG}={value!r}: use auto, True or False")


def decide(dist: ml_collections.ConfigDict, env: Mapping[str, str]) -> tuple[bool, str]:
    """(initialize?, why): the explicit flag wins; auto follows the config's address / process
    count, then the environment (``detect_cluster``)."""
    mode = initialize_mode(dist.initialize)
    if mode is not None:
        return mode, f"{FLAG}={mode}"
    if dist.get("coordinator_address", ""):
        return True, f"auto: --config.distributed.coordinator_address={dist.coordinator_address}"
    if int(dist.get("num_processes", 0) or 0) > 1:
        return True, f"auto: --config.distributed.num_processes={dist.num_processes}"
    cluster = detect_cluster(env)
    if cluster is None:
        return False, "auto: no cluster in the environment"
    return True, f"auto: {cluster.kind} ({cluster.evidence})"


def preemption_sync_available() -> bool:
    """True when JAX's preemption sync service runs: ``jax.distributed`` is initialized with
    ``jax_enable_preemption_service`` on (its default)."""
    return jax.distributed.is_initialized() and bool(jax.config.jax_enable_preemption_service)


def require_preemption_sync(process_count: int) -> None:
    """Refuse a multi-process run whose hosts could not agree on the step to stop at."""
    if process_count <= 1 or preemption_sync_available():
        return
    if jax.distributed.is_initialized():
        why, fix = (
            "jax_enable_preemption_service is off",
            "leave jax_enable_preemption_service on (JAX_ENABLE_PREEMPTION_SERVICE)",
        )
    else:
        why, fix = (
            "jax.distributed is not initialized",
            f"pass {FLAG}=True (auto starts it only when JAX_COORDINATOR_ADDRESS, an srun step "
            "with SLURM_NTASKS > 1, OMPI_COMM_WORLD_SIZE > 1 or the Cloud TPU worker variables "
            "say so)",
        )
    raise RuntimeError(
        f"{process_count} processes but no preemption sync ({why}): a SIGTERM would stop the "
        f"hosts at different steps and deadlock the checkpoint; {fix}"
    )


def _initialize_kwargs(dist: ml_collections.ConfigDict) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if dist.get("coordinator_address", ""):
        kwargs["coordinator_address"] = str(dist.coordinator_address)
    if int(dist.get("num_processes", 0) or 0):
        kwargs["num_processes"] = int(dist.num_processes)
    if int(dist.get("process_id", -1)) >= 0:
        kwargs["process_id"] = int(dist.process_id)
    return kwargs


def start(config: ml_collections.ConfigDict, env: Mapping[str, str] | None = None) -> None:
    """Join the job when ``decide`` says so, then refuse several processes without the sync.

    Call before anything touches a device: ``jax.distributed.initialize`` must come first.
    """
    dist = config.distributed
    if not jax.distributed.is_initialized():
        wanted, why = decide(dist, os.environ if env is None else env)
        if wanted:
            if dist.get("cpu_collectives", ""):
                jax.config.update("jax_cpu_collectives_implementation", dist.cpu_collectives)
            log.info("initializing jax.distributed (%s)", why)
            try:
                jax.distributed.initialize(**_initialize_kwargs(dist))
            except (ValueError, TypeError) as err:  # JAX could not work out the job's shape
                message = str(err).strip().rstrip(".")
                raise ValueError(
                    f"jax.distributed.initialize() failed ({why}): {message}; give "
                    "--config.distributed.coordinator_address, num_processes and process_id, or "
                    f"{FLAG}=False for a single process"
                ) from err
    require_preemption_sync(jax.process_count())
