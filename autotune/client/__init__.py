"""How autotune talks to a server: the HTTP client and the streamed answer's protocol. Used
by the gate and the benchmark alike, so both read a server the same way.

* :mod:`~autotune.client.http` -- the connection pool and its transport;
* :mod:`~autotune.client.send` -- sending a streamed request (one retry, on a new connection);
* :mod:`~autotune.client.stream` -- the request bodies, the SSE reader, the deadlines;
* :mod:`~autotune.client.choice` -- what an answer carries per token, in either logprobs shape.
"""

from __future__ import annotations

from autotune.client.http import StreamingClient, build_client, connect

__all__ = ["StreamingClient", "build_client", "connect"]
