"""Starting a collection on the cluster: plugin, package versions, store probe, version 0.

One coroutine for both kinds of client (:class:`~daskrl.Collector` runs it through
``client.sync`` for a synchronous one). Everything that can fail on a worker (a device, the
policy, the store's reach, the weights path) fails here, before the first batch; the run
number is claimed last, so a start that fails uses up none. The store's I/O (a listing, a
probe, the run's record: on an object store, requests of tens of milliseconds) runs in a
thread, off the client's event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid

from distributed import Client

from daskrl._process import process_token
from daskrl.collect._checks import check_probe
from daskrl.collect._resume import count_frames
from daskrl.collect._run import Run, new_run
from daskrl.collect._setup import Prepared
from daskrl.collect._supervisor import Workers
from daskrl.deploy._package_versions import acheck_versions
from daskrl.store._layout import run_first_batch
from daskrl.store._store import TrajectoryStore
from daskrl.worker._plugin import CollectorPlugin
from daskrl.worker._tasks import probe_store

__all__ = ["start_on_cluster"]

logger = logging.getLogger(__name__)


async def start_on_cluster(ready: Prepared) -> tuple[Run, int]:
    """Install the plugin on every worker, check them, and publish version 0 of the policy;
    return the started :class:`Run` and the run number claimed in the store (its record
    stores ``ready.settings``). A resumed run's frames are counted again just before
    planning; when none are left, no run is claimed (-1)."""
    client, cfg, store, weights = ready.client, ready.config, ready.store, ready.weights
    plugin_name, key_prefix, resume = ready.plugin_name, ready.key, ready.resume
    envs, settings = ready.env_specs, ready.settings
    policy, module = ready.checked.policy_spec, ready.checked.module
    await client.register_plugin(CollectorPlugin(
        plugin_name, envs, policy, cfg, cfg.device, cfg.env_vars or {}, store.url,
        store.storage_options, resumed=resume is not None,
    ), name=plugin_name)
    await acheck_versions(client)  # same torch, gymnasium, zarr, daskrl... everywhere
    workers = Workers(client, cfg.call_timeout, [])
    live = sorted(await workers.refresh(force=True))
    tokens = await workers.bounded("asking the workers for their process",
                                   client.run(process_token, workers=live))
    weights.in_process = process_token() in tokens.values()
    first_id = run_first_batch(await asyncio.to_thread(store.next_run))
    if resume is not None:  # what committed since the learner's first count counts too
        frames = await asyncio.to_thread(count_frames, store, resume.chain)
        resume = dataclasses.replace(resume, frames=frames)
    run = new_run(client, cfg, plugin_name, key_prefix, first_id, workers, weights, store,
              resume=resume, num_envs=len(envs))
    await _probe_store(client, store, plugin_name, key_prefix, workers, live)
    # Every worker builds the policy, picks its device and loads version 0 now, so a bad
    # device, policy or weights path fails here rather than in the first batch.
    await run.publish(weights.take_snapshot(module), wait=True)
    # One long-lived task per stream, each connected to the learner before the first batch.
    await run.start()
    if resume is not None and resume.complete:
        logger.warning(
            "run %d of store %r has %d frames committed, total_frames=%s: nothing is left to "
            "collect, and no run is added", resume.run, store.url, resume.frames,
            resume.total_frames)
        return run, -1
    if resume is not None:
        logger.info("resuming run %d of store %r: %d frames committed, %s to collect",
                    resume.run, store.url, resume.frames,
                    "no limit" if resume.frames_left is None else resume.frames_left)
    # Claim a run number, last: a start that fails uses up none.
    number = await asyncio.to_thread(store.register_run, settings,
                                     resumes=resume.run if resume is not None else None)
    assert first_id == run_first_batch(number)
    return run, number


async def _probe_store(client: Client, store: TrajectoryStore, plugin_name: str, probe: str,
                       workers: Workers, live: list[str]) -> None:
    """Every worker must see and write the learner's store: the classic failure is a local
    path on a cluster of several machines, where each worker writes its own directory."""
    token = uuid.uuid4().hex
    await asyncio.to_thread(store.write_probe, probe, "learner", token)
    try:
        futures = {w: client.submit(probe_store, plugin_name, probe, token, workers=[w],
                                    key=f"daskrl-probe-{probe}-{w}", pure=False) for w in live}
        for fut in (await workers.wait_each(futures, "probing the store")).values():
            await asyncio.to_thread(check_probe, store, probe, await fut, token)
    finally:
        await asyncio.to_thread(store.clear_probes, probe)
