"""What a :class:`~daskrl.Collector` is made of before it starts, each part checked on the
learner before any worker spends time: its options (merged and named right), the envs, the
policy and the store (:func:`~daskrl.collect._checks.check_on_learner`), the run's settings
and what it resumes, the cluster (the given client's, or an embedded one) and the publisher of
its weights."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from distributed import Client, LocalCluster

from daskrl.collect._checks import Checked, check_on_learner
from daskrl.collect._env_list import env_labels
from daskrl.collect._lifecycle import field_values
from daskrl.collect._resume import Resume, plan_resume, run_settings
from daskrl.config import CollectorConfig, check_option_names, renamed_options
from daskrl.deploy._cluster import check_main_importable, dashboard_link, local_cluster
from daskrl.errors import UsageError
from daskrl.store._store import TrajectoryStore
from daskrl.weights._in_store import StoreWeightsWriter
from daskrl.weights._publish import Preloads, WeightsPublisher
from daskrl.weights._snapshot import PolicyLike
from daskrl.worker._envs import EnvLike, EnvSpec
from daskrl.worker._tasks import preload_shared_weights, preload_weights

__all__ = ["Prepared", "prepare"]


@dataclasses.dataclass
class Prepared:
    """The checked parts of a collector (see the module docstring)."""

    checked: Checked
    config: CollectorConfig
    settings: dict[str, Any]
    """What the run's record stores (:func:`~daskrl.collect._resume.run_settings`)."""
    resume: Resume | None
    client: Client
    cluster: LocalCluster | None
    """The embedded cluster (``client=None``), closed with the collector."""
    dashboard_link: str | None
    key: str
    """The collector's own id: its plugin's name, its keys and its weights' names have it."""
    weights: WeightsPublisher

    @property
    def plugin_name(self) -> str:
        return self.weights.plugin_name

    @property
    def store(self) -> TrajectoryStore:
        return self.checked.store

    @property
    def env_spec(self) -> EnvSpec:
        return self.checked.env_spec

    @property
    def env_specs(self) -> tuple[EnvSpec, ...]:
        return self.checked.env_specs

    @property
    def observation_space(self) -> Any:
        return self.checked.observation_space

    @property
    def action_space(self) -> Any:
        return self.checked.action_space


def prepare(env: EnvLike | Sequence[EnvLike], policy: PolicyLike, store: str,
            storage_options: Mapping[str, Any] | None, client: Client | None,
            config: CollectorConfig | None, dashboard: bool | int | None,
            options: Mapping[str, Any]) -> Prepared:
    """Check a collector's arguments and get its cluster (see the module docstring)."""
    # The embedded cluster (client=None) runs thread workers for a memory:// store (one
    # process), worker processes otherwise, which must be able to import __main__.
    processes = not str(store).startswith("memory://")
    if client is None and processes:
        check_main_importable()
    check_option_names(options)
    options = renamed_options(options, stacklevel=3)  # the warning names the user's line
    merged = {**(field_values(config) if config is not None else {}), **options}
    given = "envs_per_worker" in options or (config is not None and config.envs_per_worker
                                             != CollectorConfig.envs_per_worker)
    # A vector env's num_envs is envs_per_worker: until the learner has made the envs, the
    # other settings are checked against one env per stream (unless it was given).
    checked = check_on_learner(env, policy, store, storage_options, merged, given)
    assert checked.config is not None
    cfg = checked.config
    settings = run_settings(env_labels(checked.env_specs), checked.observation_space,
                            checked.action_space, cfg)
    resume = plan_resume(checked.store, cfg.resume, settings)  # before any worker starts
    own: LocalCluster | None = None
    if client is not None and (dashboard is not None and dashboard is not False):
        raise UsageError("dashboard= configures the embedded cluster (client=None); the "
                         "given client's cluster serves its own: see client.dashboard_link.")
    if client is None:
        own = local_cluster(cfg.num_workers, dashboard=dashboard, processes=processes)
        client = Client(own, set_as_default=False)
    elif not isinstance(client, Client):
        raise UsageError(f"client must be a distributed.Client or None, got {client!r}.")
    key = uuid.uuid4().hex[:10]
    store_ = checked.store
    in_store = (StoreWeightsWriter(store_.backend, store_.url, key)
                if cfg.weights_in_store else None)
    weights = WeightsPublisher(client, f"daskrl-{key}", key,
                               Preloads(preload_weights, preload_shared_weights),
                               shared_memory=cfg.shared_memory, in_store=in_store)
    return Prepared(checked, cfg, settings, resume, client, own,
                    dashboard_link(own) if own is not None else None, key, weights)
