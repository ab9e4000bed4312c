"""The one place a client for a server is built: httpx for every call, aiohttp's session beneath.

The client speaks httpx everywhere (tests hand ``bench/phase.py`` and ``gate/run.py`` a client on an
``httpx.MockTransport``), but its transport to a real server is aiohttp's, through
``httpx-aiohttp``: httpx's own pure-Python HTTP/1.1 stack (h11) spent about 55 us of client CPU
per streamed token against 18 us for aiohttp's C parser. On a machine where the client and the
server share the cores, that CPU is taken from the server being measured, and throughput read
20-30% low (benchmarks/client_accuracy.py).

:class:`StreamingClient` also hands that aiohttp session to the benchmark's hot path
(``client.send.open_raw_stream``): httpx's response and byte-stream layers over aiohttp's cost
about 10 us of client CPU per streamed token more than reading aiohttp's response directly,
as ``vllm bench serve`` does. Everything else (readiness, the gate, metrics) keeps httpx's API.

``trust_env=False``: a proxy configured in the environment must never sit between autotune and
a server on 127.0.0.1. The per-trial API key travels in the Authorization header.

Connections: a server that closes a connection it advertised as kept alive (llama.cpp's
llama-server does after every streamed answer) makes the next request on it fail before any
byte of an answer (aiohttp's ``ServerDisconnectedError``, "Can not write request body"): half
of the streamed requests to it, counted as failed, stopped its benchmarks. An engine that
declares it (``Engine.reuses_connections`` False) gets a client that opens a new connection per
request (aiohttp's ``force_close``); for servers nobody declared, a request that failed that
way is sent once more on a connection opened for it (:meth:`StreamingClient.fresh`, never
another pooled one that may be just as stale), and counted (``transport_retries``), never as a
failure of the config.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

from autotune.engines.base import LaunchConfig


class _SessionTransport(AiohttpTransport):
    """httpx-aiohttp's transport, whose aiohttp session the streaming path may use too; with
    ``reuses_connections`` False, every request on a connection of its own."""

    def __init__(self, *, limits: httpx.Limits, reuses_connections: bool) -> None:
        super().__init__(limits=limits, trust_env=False)
        self.reuses_connections = reuses_connections

    def get_client(self) -> aiohttp.ClientSession:
        if self.reuses_connections:
            return super().get_client()
        # no keep-alive timeout with force_close: aiohttp refuses both
        connector = aiohttp.TCPConnector(
            force_close=True, limit=self.limits.max_connections or 0, ssl=self.ssl_context
        )
        return aiohttp.ClientSession(connector=connector)

    def session(self) -> aiohttp.ClientSession:
        """The transport's session, made on first use (it needs a running event loop)."""
        if not isinstance(self.client, aiohttp.ClientSession):
            self.client = self.get_client()
        return self.client


class StreamingClient(httpx.AsyncClient):
    """An ``httpx.AsyncClient`` over aiohttp that also offers that aiohttp session, the base
    URL and the headers to ``client.send.open_raw_stream`` (the benchmark's streamed requests)."""

    def __init__(
        self,
        base_url: str,
        headers: dict[str, str],
        *,
        max_connections: int,
        timeout_s: float,
        reuses_connections: bool = True,
    ) -> None:
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._session_transport = _SessionTransport(
            limits=limits, reuses_connections=reuses_connections
        )
        super().__init__(
            base_url=base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=5.0),
            transport=self._session_transport,
            trust_env=False,
        )
        #: the server's root, without a trailing slash: a request's URL is this + its path
        self.root_url = base_url.rstrip("/")
        #: the headers a raw streamed request sends (the key), without httpx's defaults
        self.raw_headers = dict(headers)
        #: whether a connection is kept for the next request (False: one per request)
        self.reuses_connections = reuses_connections
        #: requests sent again on a new connection after the first try's connection failed
        #: before any answer (``client.stream``): the server's connection handling, counted
        self.transport_retries = 0
        self._max_connections = max_connections
        self._timeout_s = timeout_s
        self._fresh: StreamingClient | None = None

    def aiohttp_session(self) -> aiohttp.ClientSession:
        return self._session_transport.session()

    def fresh(self) -> StreamingClient:
        """A client to the same server whose every request opens a new connection (this one
        when it already does): where a request is tried again, a pooled connection could be
        as stale as the one that just failed."""
        if not self.reuses_connections:
            return self
        if self._fresh is None:
            self._fresh = StreamingClient(
                self.root_url,
                self.raw_headers,
                max_connections=self._max_connections,
                timeout_s=self._timeout_s,
                reuses_connections=False,
            )
        return self._fresh

    async def aclose(self) -> None:
        if self._fresh is not None:
            await self._fresh.aclose()
        await super().aclose()

    async def __aexit__(self, *exc_info: Any) -> None:
        if self._fresh is not None:
            await self._fresh.aclose()
        await super().__aexit__(*exc_info)


def connect(
    base_url: str,
    api_key: str | None,
    *,
    max_connections: int = 64,
    timeout_s: float = 60.0,
    reuses_connections: bool = True,
) -> StreamingClient:
    """A client for the server at ``base_url``; ``api_key`` None sends no Authorization;
    ``reuses_connections`` the engine's word (``Engine.reuses_connections``)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return StreamingClient(
        base_url,
        headers,
        max_connections=max_connections,
        timeout_s=timeout_s,
        reuses_connections=reuses_connections,
    )


#: connections beyond the workload's concurrency: the gate's and the metrics scraper's requests
#: must never queue behind the benchmark's
SPARE_CONNECTIONS = 8


def connections_for(concurrency: int) -> int:
    """The connection pool for a workload of ``concurrency`` requests in flight."""
    return concurrency + SPARE_CONNECTIONS


def build_client(
    launch: LaunchConfig,
    *,
    max_connections: int = 64,
    timeout_s: float = 60.0,
    reuses_connections: bool = True,
) -> StreamingClient:
    """The client for a launched server; pass its engine's ``reuses_connections``."""
    return connect(
        launch.base_url,
        launch.api_key,
        max_connections=max_connections,
        timeout_s=timeout_s,
        reuses_connections=reuses_connections,
    )


def transport_retries(client: httpx.AsyncClient) -> int | None:
    """How many requests ``client`` sent again on a new connection; None for a client that
    does not count them (a test's ``httpx.MockTransport``): never measured, not 0."""
    return client.transport_retries if isinstance(client, StreamingClient) else None
