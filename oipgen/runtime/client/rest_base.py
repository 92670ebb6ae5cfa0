"""The REST clients' machinery: connections, requests, errors, health answers and server-sent events. `rest.py`
(rendered from the spec) holds one method per operation, each choosing its endpoint and body from the spec and
calling the ways of `RestClientBase` (sync) or `AsyncRestClientBase` (asyncio), both on httpx.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from typing import Any, Final, Self
from urllib.parse import quote

import httpx
import orjson
from pydantic import BaseModel

from ._shared import EventReader, Headers, event_answer, merge
from .errors import DeadlineExceeded, OipClientError, ResponseError, Unavailable, from_http
from .propagation import with_trace_context
from .tensors import BINARY_EXTENSION

__all__ = [
    "EVENT_HEADERS", "JSON_HEADERS", "AsyncRestClientBase", "RestClientBase", "check", "health", "json_body", "load",
    "q", "timeout_arg", "tls",
]

DEFAULT_HEADERS: Final = {"Accept-Encoding": "identity"}  # compressing tensors costs more than it saves on a LAN
JSON_HEADERS: Final = {"Content-Type": "application/json"}
EVENT_HEADERS: Final = {"Content-Type": "application/json", "Accept": "text/event-stream"}
_NOT_READY: Final = (400, 503)  # the statuses of a health answer that says "no" (Triton: 400 with no body)


def q(value: str) -> str:
    """A path segment, percent-encoded."""
    return quote(str(value), safe="")


def timeout_arg(value: float | None) -> Any:
    return httpx.USE_CLIENT_DEFAULT if value is None else value


def json_body(model: BaseModel) -> bytes:
    return orjson.dumps(model.model_dump(mode="json", by_alias=True, exclude_none=True))


def tls(verify: bool | str | ssl.SSLContext, cert: str | tuple[str, str] | None) -> bool | ssl.SSLContext:
    """httpx's `verify` for these options (an SSLContext when a CA file or client certificate is given)."""
    if isinstance(verify, ssl.SSLContext):
        if cert is not None:
            verify.load_cert_chain(*((cert,) if isinstance(cert, str) else cert))
        return verify
    if cert is None and not isinstance(verify, str):
        return verify
    context = ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)
    if verify is False:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert is not None:
        context.load_cert_chain(*((cert,) if isinstance(cert, str) else cert))
    return context


def check(response: httpx.Response) -> None:
    if not 200 <= response.status_code < 300:
        raise from_http(response.status_code, response.content)


def load(response: httpx.Response) -> Any:
    """The JSON body of a successful answer."""
    check(response)
    try:
        return orjson.loads(response.content)
    except orjson.JSONDecodeError as exc:
        raise ResponseError(f"the server's answer is not JSON: {exc}", status=response.status_code) from None


def health(response: httpx.Response, flag: str, path: dict[str, str]) -> Any:
    """The body of a health answer. Without a body, 200 says yes and a not-ready status (400, 503) says no, as
    Triton and MLServer answer; a not-ready status with the answer's own body is an answer, not an error."""
    status, content = response.status_code, response.content
    if status == 200 or status in _NOT_READY:
        if not content.strip():
            return {**path, flag: status == 200}
        try:
            answer = orjson.loads(content)
        except orjson.JSONDecodeError:
            answer = None
        if isinstance(answer, dict) and flag in answer and "error" not in answer:
            return answer
    return load(response)


class _RestBase:
    """What both REST clients hold besides their connection pool."""

    def __init__(self, url: str, binary: bool | None) -> None:
        if "://" not in url:
            url = "http://" + url
        self.url = url.rstrip("/")
        self.binary = binary
        self._server_binary: bool | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def _binary_choice(self, binary: bool | None) -> bool | None:
        """Whether a request sends binary tensor data, when the arguments or the client decide it (else None)."""
        if binary is not None:
            return binary
        if self.binary is not None:
            return self.binary
        return self._server_binary

    def _unreachable(self, method: str, path: str, exc: httpx.HTTPError) -> OipClientError:
        if isinstance(exc, httpx.TimeoutException):
            return DeadlineExceeded(f"{method} {path}: timed out ({type(exc).__name__})")
        if isinstance(exc, httpx.TransportError):
            return Unavailable(f"{method} {self.url}{path}: {exc or type(exc).__name__}")
        return OipClientError(f"{method} {self.url}{path}: {exc or type(exc).__name__}")


class RestClientBase(_RestBase):
    """A REST client of an Open Inference Protocol server (httpx.Client).

    One connection pool per client (HTTP/1.1 keep-alive); use it as a context manager or call `close()`.

    - `url`: the server's base URL (`http://host:8000`; a scheme-less `host:8000` means http; a path prefix is kept).
    - `timeout`: seconds per request (None: none), or an `httpx.Timeout`; each method also takes `timeout=`.
    - `headers`: sent with every request (each method also takes `headers=`).
    - `verify`: TLS server verification: True, False, a CA bundle path or an `ssl.SSLContext`; `cert`: a client
      certificate file, or (certificate, key) files.
    - `binary`: send tensors with the binary tensor data extension (True), as JSON (False), or (None) binary
      when the server lists `binary_tensor_data` in its metadata, asked once per client.
    - `trust_env`: read proxies and certificates from the environment, as httpx does.
    - `transport`: an httpx transport (tests: `httpx.MockTransport`).
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:8000",
        *,
        timeout: float | httpx.Timeout | None = 60.0,
        headers: Headers | None = None,
        verify: bool | str | ssl.SSLContext = True,
        cert: str | tuple[str, str] | None = None,
        binary: bool | None = None,
        trust_env: bool = True,
        max_connections: int = 100,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(url, binary)
        self._http = httpx.Client(
            base_url=self.url,
            timeout=timeout,
            headers={**DEFAULT_HEADERS, **(headers or {})},
            verify=tls(verify, cert),
            trust_env=trust_env,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            transport=transport,
        )

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def _extensions(self) -> list[str]:
        """The extensions the server lists in its metadata (the generated client asks its metadata operation)."""
        raise NotImplementedError

    def _send(
        self, method: str, path: str, content: bytes | None, headers: Headers | None, timeout: float | None
    ) -> httpx.Response:
        try:
            return self._http.request(
                method, path, content=content, headers=with_trace_context(headers), timeout=timeout_arg(timeout)
            )
        except httpx.HTTPError as exc:
            raise self._unreachable(method, path, exc) from exc

    def _use_binary(self, binary: bool | None) -> bool:
        """Whether this request sends binary tensor data: as asked, else the client's choice, else whether the
        server lists the extension (asked once; an error answer counts as no)."""
        chosen = self._binary_choice(binary)
        if chosen is not None:
            return chosen
        try:
            extensions = self._extensions()
        except OipClientError as exc:
            if exc.status is None:  # no answer at all: decide on a later request
                raise
            self._server_binary = False
        else:
            self._server_binary = BINARY_EXTENSION in extensions
        return self._server_binary

    def _events(
        self, method: str, path: str, content: bytes, headers: Headers | None, timeout: float | None
    ) -> Iterator[dict[str, Any]]:
        """The answers of a server-sent events stream, as they come."""
        reader = EventReader()
        try:
            with self._http.stream(
                method, path, content=content, headers=merge(EVENT_HEADERS, headers), timeout=timeout_arg(timeout)
            ) as response:
                if response.status_code != 200:
                    raise from_http(response.status_code, response.read())
                for line in response.iter_lines():
                    data = reader.feed(line)
                    if data is not None:
                        yield event_answer(data, response.status_code)
        except httpx.HTTPError as exc:
            raise self._unreachable(method, path, exc) from exc


class AsyncRestClientBase(_RestBase):
    """An asyncio REST client of an Open Inference Protocol server (httpx.AsyncClient).

    One connection pool per client (HTTP/1.1 keep-alive); use it as an async context manager or call `await close()`.

    - `url`: the server's base URL (`http://host:8000`; a scheme-less `host:8000` means http; a path prefix is kept).
    - `timeout`: seconds per request (None: none), or an `httpx.Timeout`; each method also takes `timeout=`.
    - `headers`: sent with every request (each method also takes `headers=`).
    - `verify`: TLS server verification: True, False, a CA bundle path or an `ssl.SSLContext`; `cert`: a client
      certificate file, or (certificate, key) files.
    - `binary`: send tensors with the binary tensor data extension (True), as JSON (False), or (None) binary
      when the server lists `binary_tensor_data` in its metadata, asked once per client.
    - `trust_env`: read proxies and certificates from the environment, as httpx does.
    - `transport`: an httpx transport (tests: `httpx.ASGITransport`).
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:8000",
        *,
        timeout: float | httpx.Timeout | None = 60.0,
        headers: Headers | None = None,
        verify: bool | str | ssl.SSLContext = True,
        cert: str | tuple[str, str] | None = None,
        binary: bool | None = None,
        trust_env: bool = True,
        max_connections: int = 100,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(url, binary)
        self._http = httpx.AsyncClient(
            base_url=self.url,
            timeout=timeout,
            headers={**DEFAULT_HEADERS, **(headers or {})},
            verify=tls(verify, cert),
            trust_env=trust_env,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            transport=transport,
        )

    async def close(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()

    async def _extensions(self) -> list[str]:
        """The extensions the server lists in its metadata (the generated client asks its metadata operation)."""
        raise NotImplementedError

    async def _send(
        self, method: str, path: str, content: bytes | None, headers: Headers | None, timeout: float | None
    ) -> httpx.Response:
        try:
            return await self._http.request(
                method, path, content=content, headers=with_trace_context(headers), timeout=timeout_arg(timeout)
            )
        except httpx.HTTPError as exc:
            raise self._unreachable(method, path, exc) from exc

    async def _use_binary(self, binary: bool | None) -> bool:
        """Whether this request sends binary tensor data: as asked, else the client's choice, else whether the
        server lists the extension (asked once; an error answer counts as no)."""
        chosen = self._binary_choice(binary)
        if chosen is not None:
            return chosen
        try:
            extensions = await self._extensions()
        except OipClientError as exc:
            if exc.status is None:  # no answer at all: decide on a later request
                raise
            self._server_binary = False
        else:
            self._server_binary = BINARY_EXTENSION in extensions
        return self._server_binary

    async def _events(
        self, method: str, path: str, content: bytes, headers: Headers | None, timeout: float | None
    ) -> AsyncIterator[dict[str, Any]]:
        """The answers of a server-sent events stream, as they come."""
        reader = EventReader()
        try:
            async with self._http.stream(
                method, path, content=content, headers=merge(EVENT_HEADERS, headers), timeout=timeout_arg(timeout)
            ) as response:
                if response.status_code != 200:
                    raise from_http(response.status_code, await response.aread())
                async for line in response.aiter_lines():
                    data = reader.feed(line)
                    if data is not None:
                        yield event_answer(data, response.status_code)
        except httpx.HTTPError as exc:
            raise self._unreachable(method, path, exc) from exc
