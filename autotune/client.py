"""The one place an ``httpx.AsyncClient`` for a server is built.

The client speaks httpx everywhere (tests hand ``bench.py`` and ``gate.py`` a client on an
``httpx.MockTransport``), but its transport to a real server is aiohttp's, through
``httpx-aiohttp``: httpx's own pure-Python HTTP/1.1 stack (h11) spent about 55 us of client CPU
per streamed token against 18 us for aiohttp's C parser. On a machine where the client and the
server share the cores, that CPU is taken from the server being measured, and throughput read
20-30% low (benchmarks/client_accuracy.py).

``trust_env=False``: a proxy configured in the environment must never sit between autotune and
a server on 127.0.0.1. The per-trial API key travels in the Authorization header.
"""

from __future__ import annotations

import httpx
from httpx_aiohttp import AiohttpTransport

from autotune.engines.base import LaunchConfig


def build_transport(max_connections: int) -> httpx.AsyncBaseTransport:
    limits = httpx.Limits(
        max_connections=max_connections, max_keepalive_connections=max_connections
    )
    return AiohttpTransport(limits=limits, trust_env=False)


def build_client(
    launch: LaunchConfig, *, max_connections: int = 64, timeout_s: float = 60.0
) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=launch.base_url,
        headers={"Authorization": f"Bearer {launch.api_key}"},
        timeout=httpx.Timeout(timeout_s, connect=5.0),
        transport=build_transport(max_connections),
        trust_env=False,
    )
