#!/usr/bin/env python3
"""rr_proxy.py	a small round-robin HTTP proxy in front of several vLLM servers (streams responses through).

usage: rr_proxy.py --port P --backend http://127.0.0.1:8001 --backend http://127.0.0.1:8002 [--host 127.0.0.1]

Each request goes to the next backend in turn (GET /health answers 200 only when every backend does). The backend
that served a request is named in the `x-kvtier-backend` response header, so tests can check the rotation.
"""

from __future__ import annotations

import argparse
import itertools

import aiohttp
from aiohttp import web

HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding"}


def make_app(backends: list[str]) -> web.Application:
    rr = itertools.cycle(range(len(backends)))
    state: dict = {}

    async def on_start(app):
        state["s"] = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5), auto_decompress=False
        )

    async def on_stop(app):
        await state["s"].close()

    async def health(request):
        try:
            for b in backends:
                async with state["s"].get(b + "/health") as r:
                    if r.status != 200:
                        return web.Response(status=503, text=f"{b} unhealthy")
        except aiohttp.ClientError as exc:
            return web.Response(status=503, text=str(exc))
        return web.Response(text="ok")

    async def forward(request: web.Request):
        i = next(rr)
        url = backends[i] + request.path_qs
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        body = await request.read()
        try:
            async with state["s"].request(request.method, url, headers=headers, data=body) as up:
                resp = web.StreamResponse(status=up.status)
                for k, v in up.headers.items():
                    if k.lower() not in HOP:
                        resp.headers[k] = v
                resp.headers["x-kvtier-backend"] = str(i)
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        except aiohttp.ClientError as exc:
            return web.Response(status=502, text=f"backend {i}: {exc}")

    app = web.Application(client_max_size=64 << 20)
    app.on_startup.append(on_start)
    app.on_cleanup.append(on_stop)
    app.router.add_get("/health", health)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--backend", action="append", required=True)
    a = ap.parse_args()
    web.run_app(make_app([b.rstrip("/") for b in a.backend]), host=a.host, port=a.port, print=None)


if __name__ == "__main__":
    main()
