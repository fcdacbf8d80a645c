"""A hostile HTTP/2 client (the proxy tests; bench hostile's holder): one cleartext connection (prior
knowledge) that opens streams with their HEADERS only, never a DATA frame, and keeps them open until closed.

    async with HeadersOnly(proxy.grpc_target, path) as conn:
        await conn.open(4, [("x-tenant", "victim")])     # four streams, each waiting for its body

Frames by hand (RFC 9113; HPACK literals without indexing, RFC 7541 6.2.2): no HTTP/2 library is a
dependency. The connection answers the server's SETTINGS and PINGs so the server has no protocol
reason to close it; what a test sees is only the server's own rules about unfinished requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from types import TracebackType

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"  # the client connection preface
FRAME_HEADER_BYTES = 9  # length (3), type (1), flags (1), stream id (4)
HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x1, 0x3, 0x4, 0x6, 0x7  # frame types
END_HEADERS, ACK = 0x4, 0x1  # flags
LITERAL_NEW_NAME = 0x00  # HPACK: literal header field without indexing, new name
SHORT_STRING = 0x7F  # HPACK: the largest string length written in one byte (no Huffman)
STREAM_ID_MASK = 0x7FFFFFFF  # a frame's stream id without the reserved bit
FIRST_STREAM = 1  # client streams are odd
CONNECT_S = 5.0  # deadline of the TCP connect


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame: 9-byte header, then the payload."""
    head = struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream)
    return head + payload


def _string(text: str) -> bytes:
    raw = text.encode()
    if len(raw) >= SHORT_STRING:
        raise ValueError(f"header text longer than {SHORT_STRING - 1} bytes: {text[:20]!r}...")
    return bytes([len(raw)]) + raw


def header_block(headers: list[tuple[str, str]]) -> bytes:
    """HPACK block of ``headers``, each a literal without indexing (names lower case)."""
    return b"".join(bytes([LITERAL_NEW_NAME]) + _string(name) + _string(value) for name, value in headers)


class HeadersOnly:
    """One HTTP/2 connection to ``target`` (HOST:PORT) whose streams never send their body."""

    def __init__(self, target: str, path: str, content_type: str = "application/grpc") -> None:
        self.host, port = target.rsplit(":", 1)
        self.port = int(port)
        self.base = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", target),
                     ("content-type", content_type), ("te", "trailers")]
        self.next_stream = FIRST_STREAM
        self.opened: list[int] = []  # stream ids opened, in order
        self.answered: set[int] = set()  # streams the server replied to (HEADERS) or reset (RST_STREAM)
        self.closed_by_peer = asyncio.Event()  # set once the server closed the connection (or sent GOAWAY)

    async def __aenter__(self) -> HeadersOnly:
        self.reader, self.writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port), CONNECT_S)
        self.writer.write(PREFACE + frame(SETTINGS, 0, 0))
        await self.writer.drain()
        self._pump = asyncio.create_task(self._answer())
        return self

    async def open(self, count: int, extra: list[tuple[str, str]]) -> None:
        """``count`` more streams, HEADERS only (END_HEADERS, no END_STREAM), with ``extra`` headers."""
        for _ in range(count):
            block = header_block(self.base + extra)
            self.writer.write(frame(HEADERS, END_HEADERS, self.next_stream, block))
            self.opened.append(self.next_stream)
            self.next_stream += 2
        await self.writer.drain()

    def unanswered(self) -> list[int]:
        """Opened streams the server has neither replied to nor reset (still held, unless it closed)."""
        return [] if self.closed_by_peer.is_set() else [s for s in self.opened if s not in self.answered]

    async def _answer(self) -> None:
        """Read the server's frames: ACK its SETTINGS, echo its PINGs, note replies, GOAWAY or EOF."""
        try:
            while True:
                head = await self.reader.readexactly(FRAME_HEADER_BYTES)
                length = int.from_bytes(head[:3], "big")
                kind, flags = head[3], head[4]
                stream = int.from_bytes(head[5:], "big") & STREAM_ID_MASK
                payload = await self.reader.readexactly(length)
                if kind in (HEADERS, RST_STREAM):
                    self.answered.add(stream)
                elif kind == SETTINGS and not flags & ACK:
                    self.writer.write(frame(SETTINGS, ACK, 0))
                elif kind == PING and not flags & ACK:
                    self.writer.write(frame(PING, ACK, 0, payload))
                elif kind == GOAWAY:
                    self.closed_by_peer.set()
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed_by_peer.set()

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self._pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._pump
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()
