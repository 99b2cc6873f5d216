"""The gateway's listening socket: connections it accepts send small writes at once (TCP_NODELAY),
so a response written in parts (headers, then body; SSE chunks) does not wait on the client's
delayed ACK."""
from __future__ import annotations

import asyncio
import socket

from baton.services.gateway.server import listen_socket


def test_accepted_connections_have_nagle_off():
    async def accepted_nodelay() -> int:
        sock = listen_socket("127.0.0.1", 0)
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted = writer.get_extra_info("socket")
            seen.set_result(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_connect, sock=sock)
        _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        try:
            return await asyncio.wait_for(seen, 10)
        finally:
            writer.close()
            server.close()

    sock = listen_socket("127.0.0.1", 0)
    assert sock.proto == socket.IPPROTO_TCP
    sock.close()
    assert asyncio.run(accepted_nodelay()) != 0
