"""A slow network link on 127.0.0.1: a TCP relay that passes bytes both ways, sends the
server's bytes to the client at most `bytes_per_s` per connection, and counts them.

Not a server of its own: it understands nothing of what it carries (HTTP here), it only
makes a download take long enough to be stopped half-way, and it measures the bytes a
client received. `cut()` drops every connection at once, as a network that fails does.
"""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType

CHUNK = 16 * 1024


class SlowLink:
    def __init__(self, target_port: int, bytes_per_s: float | None) -> None:
        self.target_port = target_port
        self.bytes_per_s = bytes_per_s
        self.bytes_down = 0  # server to client, all connections
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> SlowLink:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the slow link did not start")
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cut()
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def cut(self) -> None:
        """Close every open connection (new ones are still accepted)."""

        def close_all() -> None:
            for writer in list(self._writers):
                writer.transport.abort()

        self._loop.call_soon_threadsafe(close_all)

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_w.transport.abort()
            return
        self._writers |= {client_w, server_w}
        try:
            await asyncio.gather(
                self._pump(client_r, server_w, throttle=False),
                self._pump(server_r, client_w, throttle=True),
            )
        finally:
            for writer in (client_w, server_w):
                self._writers.discard(writer)
                writer.transport.abort()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, throttle: bool
    ) -> None:
        try:
            while chunk := await reader.read(CHUNK):
                writer.write(chunk)
                await writer.drain()
                if throttle:
                    self.bytes_down += len(chunk)
                    if self.bytes_per_s:
                        await asyncio.sleep(len(chunk) / self.bytes_per_s)
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            writer.transport.abort()
