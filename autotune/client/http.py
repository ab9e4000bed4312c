"""The one place a client for a server is built: httpx for every call, aiohttp's session beneath.

The client speaks httpx everywhere (tests hand ``bench/phase.py`` and ``gate/run.py`` a client on an
``httpx.MockTransport``), but its transport to a real server is aiohttp's, through
``httpx-aiohttp``: httpx's own pure-Python HTTP/1.1 stack (h11) spent about 55 us of client CPU
per streamed token against 18 us for aiohttp's C parser. On a machine where the client and the
server share the cores, that CPU is taken from the server being measured, and throughput read
20-30% low (benchmarks/client_accuracy.py).

:class:`StreamingClient` also hands that aiohttp session to the benchmark's hot path
(``protocol.open_raw_stream``): httpx's response and byte-stream layers over aiohttp's cost
about 10 us of client CPU per streamed token more than reading aiohttp's response directly,
as ``vllm bench serve`` does. Everything else (readiness, the gate, metrics) keeps httpx's API.

``trust_env=False``: a proxy configured in the environment must never sit between autotune and
a server on 127.0.0.1. The per-trial API key travels in the Authorization header.
"""

from __future__ import annotations

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

from autotune.engines.base import LaunchConfig


class _SessionTransport(AiohttpTransport):
    """httpx-aiohttp's transport, whose aiohttp session the streaming path may use too."""

    def session(self) -> aiohttp.ClientSession:
        """The transport's session, made on first use (it needs a running event loop)."""
        if not isinstance(self.client, aiohttp.ClientSession):
            self.client = self.get_client()
        return self.client


class StreamingClient(httpx.AsyncClient):
    """An ``httpx.AsyncClient`` over aiohttp that also offers that aiohttp session, the base
    URL and the headers to ``protocol.open_raw_stream`` (the benchmark's streamed requests)."""

    def __init__(
        self, base_url: str, headers: dict[str, str], *, max_connections: int, timeout_s: float
    ) -> None:
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._session_transport = _SessionTransport(limits=limits, trust_env=False)
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

    def aiohttp_session(self) -> aiohttp.ClientSession:
        return self._session_transport.session()


def connect(
    base_url: str, api_key: str | None, *, max_connections: int = 64, timeout_s: float = 60.0
) -> StreamingClient:
    """A client for the server at ``base_url``; ``api_key`` None sends no Authorization."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return StreamingClient(base_url, headers, max_connections=max_connections, timeout_s=timeout_s)


#: connections beyond the workload's concurrency: the gate's and the metrics scraper's requests
#: must never queue behind the benchmark's
SPARE_CONNECTIONS = 8


def connections_for(concurrency: int) -> int:
    """The connection pool for a workload of ``concurrency`` requests in flight."""
    return concurrency + SPARE_CONNECTIONS


def build_client(
    launch: LaunchConfig, *, max_connections: int = 64, timeout_s: float = 60.0
) -> StreamingClient:
    return connect(
        launch.base_url, launch.api_key, max_connections=max_connections, timeout_s=timeout_s
    )
