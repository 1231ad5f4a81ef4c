"""The learner of the multi-host tests: a process of its own, started on host 0.

``python hosts_learner.py CONFIG.json`` connects to the scheduler, collects with the settings
in the config and writes ``result.json`` next to the config: the handles it got, the seconds
each ``update_weights`` took, or the error that stopped it. After each handle whose index is
in ``pause_after`` it writes ``paused-<i>`` and waits (at most ``pause_limit`` seconds) for
the test to create ``go-<i>`` (having cut a link or killed a host meanwhile); with
``update_weights`` it then publishes a new version (the policy's tag set to it). Optional:
``dask_config`` set around the collection, ``ballast_mib`` of weights the policy carries.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path


def main(config_path: str) -> int:
    config = json.loads(Path(config_path).read_text())
    ctl = Path(config_path).parent
    result: dict = {"handles": [], "update_seconds": [], "error": None}
    t_start = time.monotonic()
    try:
        import dask
        import torch

        import daskrl
        from daskrl import deploy
        from daskrl.testing import TagPolicy

        security = None
        if config.get("tls"):
            tls = config["tls"]
            security = deploy.tls_security(tls["ca"], tls["cert"], tls["key"])
        policy = TagPolicy()
        if config.get("ballast_mib"):  # weights this big (a buffer the policy never reads)
            policy.register_buffer("ballast", torch.ones(int(config["ballast_mib"] * 2**18)))
        with (
            dask.config.set(config.get("dask_config", {})),
            deploy.connect(config["address"], security=security) as d,
            daskrl.Collector(config.get("env", "daskrl.testing:Counting-v0"), policy,
                             config["store"], client=d.client,
                             **config.get("collector", {})) as collector,
        ):
            result["transport_at_start"] = collector.weights_transport
            for i, handle in enumerate(collector):
                result["handles"].append({
                    "batch_id": handle.batch_id, "frames": handle.frames,
                    "worker": handle.worker, "weights_version": handle.weights_version,
                    "t": time.monotonic() - t_start})
                if i in config.get("pause_after", []):
                    (ctl / f"paused-{i}").write_text("")
                    deadline = time.monotonic() + config.get("pause_limit", 300)
                    while not (ctl / f"go-{i}").exists():
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"the test did not say go after batch {i}")
                        time.sleep(0.05)
                if config.get("update_weights"):
                    with torch.no_grad():
                        policy.tag.fill_(collector.weights_version + 1)
                    t0 = time.monotonic()
                    collector.update_weights(policy)
                    result["update_seconds"].append(time.monotonic() - t0)
            result["summary"] = {k: v for k, v in collector.summary().items()
                                 if k in ("frames", "batches", "weights_version")}
            result["transport"] = collector.weights_transport
            name = collector.plugin_name

            def sources(dask_worker) -> list:
                return dask_worker.plugins[name].weight_sources

            if config.get("weight_sources"):  # where each worker got each version from
                result["weight_sources"] = collector.client.run(sources, on_error="ignore",
                                                                callback_timeout=30)
    except Exception as e:
        result["error"] = {"type": type(e).__name__, "message": str(e),
                           "daskrl": type(e).__module__.startswith("daskrl"),
                           "traceback": traceback.format_exc()}
    result["seconds"] = time.monotonic() - t_start
    tmp = ctl / "result.json.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    tmp.rename(ctl / "result.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
