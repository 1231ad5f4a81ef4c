"""The learner's listener: where streams send their handles, straight from the workers.

Each stream (:mod:`daskrl.worker._stream`) connects to the learner over ``distributed.comm``,
with the cluster's own security (TLS where the cluster uses it) and serialization, and the
scheduler is not on the way. The listener listens on the address the learner reaches the
scheduler from (the workers reach the scheduler, and the learner is usually beside it), or on
``daskrl.learner.host`` from the Dask config; an in-process cluster's streams connect in
process (``inproc://``). A stream says hello with the collection's secret token, its index and
its epoch; :class:`Listener` passes the accepted ones and their messages to its owner.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import dask
from distributed import Client
from distributed.comm import CommClosedError, listen

from daskrl.collect._supervisor import scheduler

__all__ = ["Listener", "listen_address"]

logger = logging.getLogger(__name__)


def listen_address(client: Client) -> str:
    """Where the learner listens for its streams (see the module docstring)."""
    scheme = urlsplit(str(scheduler(client).address)).scheme or "tcp"
    if scheme == "inproc":
        return "inproc://"
    host = dask.config.get("daskrl.learner.host", None)
    if host is None:
        comm = getattr(client.scheduler_comm, "comm", None)
        local = getattr(comm, "local_address", None) or ""
        host = urlsplit(str(local)).hostname or "0.0.0.0"
    return f"{scheme}://{_bracketed(str(host))}:0"


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class Listener:
    """Accepts streams of one collection (those that know ``token``): ``on_open(stream,
    epoch, comm)`` says whether it wants the stream (a newer epoch may run elsewhere);
    ``on_message(stream, epoch, msg)`` gets each message; ``on_close(stream, epoch)`` the
    end of an accepted stream's channel."""

    def __init__(self, client: Client, token: str,
                 on_open: Callable[[int, int, Any], bool],
                 on_message: Callable[[int, int, dict[str, Any]], None],
                 on_close: Callable[[int, int], None]) -> None:
        self.client = client
        self.token = token
        self.on_open, self.on_message, self.on_close = on_open, on_message, on_close
        self._listener: Any = None
        self.connections = 0
        """Streams accepted so far (restarts included)."""

    async def start(self) -> str:
        """Start listening; return the address streams connect to."""
        address = listen_address(self.client)
        args = (self.client.security.get_listen_args("client")
                if not address.startswith("inproc") else {})
        self._listener = listen(address, self._handle, deserialize=True, **args)
        await self._listener.start()
        return str(self._listener.contact_address)

    async def _handle(self, comm: Any) -> None:
        stream = epoch = -1
        accepted = False
        try:
            hello = await comm.read()
            ok = (isinstance(hello, dict) and hello.get("op") == "hello"
                  and hello.get("token") == self.token)
            if ok:
                stream, epoch = int(hello["stream"]), int(hello["epoch"])
            if not ok or not self.on_open(stream, epoch, comm):
                await comm.write({"op": "refused"})
                comm.abort()
                return
            accepted = True
            self.connections += 1
            await comm.write({"op": "ok"})
            while True:
                self.on_message(stream, epoch, await comm.read())
        except (CommClosedError, OSError):
            pass
        except Exception:  # a message this learner cannot read: drop the stream's channel
            logger.exception("a stream's channel failed; it is started again")
            comm.abort()
        if accepted:
            self.on_close(stream, epoch)

    def stop(self) -> None:
        if self._listener is not None:
            self._listener.stop()
            self._listener = None
