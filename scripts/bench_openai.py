#!/usr/bin/env python
"""Benchmark the ``openai`` engine's own cost per call: ours vs a raw aiohttp client, same run, same stub.

A stub OpenAI-compatible server (aiohttp.web on 127.0.0.1, in a separate process so its CPU is not
the client's) answers every ``POST /v1/chat/completions`` at once with a short chat completion
(usage included). Against it, in this one process, alternating rounds:

- ``ours``: ``make_engine("openai", ...)`` at ``max_concurrency=C``; every call is one
  ``engine.generate([request])`` (how episodes call it), all started together.
- ``raw``: the least a client can do: one ``aiohttp.ClientSession`` (connection limit C), the same
  JSON body per call, ``await resp.json()``, the reply text taken out; nothing checked.

Reported per side (median over rounds): wall calls/s, this process's CPU per call (user + system,
``time.process_time``), and the stub's CPU per call (psutil); the ratios ours/raw. On a machine
with few cores the wall rate is capped by the cores the client and the stub share; the client CPU
per call is the figure that does not depend on them (1 / CPU per call = the most calls/s one
client core can drive).

Options:
  --calls N        calls per round and side (default 20000)
  --concurrency C  requests in flight (default 256)
  --rounds R       rounds, each runs ours then raw (default 3)
  --reply-chars K  length of the stub's reply text (default 200)
  --json FILE      also write the figures as JSON
  --profile FILE   run ours once more under cProfile and write the stats there (pstats format)

Example:
  nice -n 10 python scripts/bench_openai.py --calls 20000 --concurrency 256 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

MODEL = "stub-model"


# ---------------------------------------------------------------------------------------- the stub


def serve(port: int, reply_chars: int) -> None:
    """The stub server (runs in its own process): a fixed short chat completion for every call."""
    from aiohttp import web

    text = ("stub " * (reply_chars // 5 + 1))[:reply_chars]
    reply = json.dumps({
        "id": "stub", "object": "chat.completion", "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 24, "completion_tokens": 16, "total_tokens": 40},
    }).encode()

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=reply, content_type="application/json")

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port, backlog=4096)
        await site.start()
        bound = runner.addresses[0][1]
        print(bound, flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


class Stub:
    """The stub server in a child process; ``url`` its ``/v1`` root, ``cpu_s()`` its CPU so far."""

    def __init__(self, reply_chars: int) -> None:
        import psutil

        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", "--reply-chars", str(reply_chars)],
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.strip().isdigit():
            self.proc.kill()
            raise SystemExit(f"bench_openai: the stub server did not start (it printed {line!r})")
        self.url = f"http://127.0.0.1:{int(line)}/v1"
        self.ps = psutil.Process(self.proc.pid)

    def cpu_s(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        if self.proc.stdout:
            self.proc.stdout.close()


# ---------------------------------------------------------------------------------------- clients


def make_request(i: int) -> Any:
    from drmas_bench.types import Request, Sampling

    return Request("a", [{"role": "system", "content": "You answer questions."},
                         {"role": "user", "content": f"question number {i}: what is the capital of France?"}],
                   Sampling(temperature=1.0, top_p=1.0, max_new_tokens=16))


async def run_ours(url: str, n: int, conc: int) -> None:
    from drmas_bench.engines import make_engine

    eng = make_engine("openai", MODEL, base_url=url, max_concurrency=conc, tokenizer="none")
    texts: list[str] = []

    async def one(i: int) -> None:
        out = (await eng.generate([make_request(i)]))[0]
        assert out.completion_tokens == 16
        texts.append(out.text)

    await asyncio.gather(*(one(i) for i in range(n)))
    await eng.close()
    assert len(texts) == n


async def run_raw(url: str, n: int, conc: int) -> None:
    import aiohttp

    sem = asyncio.Semaphore(conc)
    texts: list[str] = []

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        body = {"model": MODEL, "messages": [{"role": "system", "content": "You answer questions."},
                                             {"role": "user", "content": f"question number {i}: what is the capital of France?"}],
                "temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 16,
                "chat_template_kwargs": {"enable_thinking": False}}
        async with sem:
            async with session.post(f"{url}/chat/completions", json=body) as resp:
                data = await resp.json()
        texts.append(data["choices"][0]["message"]["content"])

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conc)) as session:
        await asyncio.gather(*(one(session, i) for i in range(n)))
    assert len(texts) == n


def measure(side: str, stub: Stub, n: int, conc: int) -> dict[str, float]:
    fn = run_ours if side == "ours" else run_raw
    s0, c0, t0 = stub.cpu_s(), time.process_time(), time.perf_counter()
    asyncio.run(fn(stub.url, n, conc))
    wall, cpu, scpu = time.perf_counter() - t0, time.process_time() - c0, stub.cpu_s() - s0
    return {"calls_per_s": n / wall, "client_cpu_ms": 1000 * cpu / n, "stub_cpu_ms": 1000 * scpu / n, "wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=20000, help="calls per round and side (default 20000)")
    ap.add_argument("--concurrency", type=int, default=256, help="requests in flight (default 256)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each runs ours then raw (default 3)")
    ap.add_argument("--reply-chars", type=int, default=200, help="length of the stub's reply text (default 200)")
    ap.add_argument("--json", dest="json_out", help="also write the figures as JSON")
    ap.add_argument("--profile", help="run ours once more under cProfile, stats written to this file")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the stub's own process
    args = ap.parse_args(argv)
    if args.serve:
        serve(0, args.reply_chars)
        return 0
    stub = Stub(args.reply_chars)
    try:
        measure("raw", stub, min(2000, args.calls), args.concurrency)  # warm-up: imports, first connections
        measure("ours", stub, min(2000, args.calls), args.concurrency)
        rows: dict[str, list[dict[str, float]]] = {"ours": [], "raw": []}
        for r in range(args.rounds):
            for side in ("ours", "raw"):
                rows[side].append(measure(side, stub, args.calls, args.concurrency))
                m = rows[side][-1]
                print(f"[bench] round {r + 1} {side}: {m['calls_per_s']:.0f} calls/s, client CPU {m['client_cpu_ms']:.3f} ms/call, "
                      f"stub CPU {m['stub_cpu_ms']:.3f} ms/call", file=sys.stderr, flush=True)
        if args.profile:
            import cProfile

            cProfile.runctx("asyncio.run(run_ours(stub.url, args.calls, args.concurrency))", globals(),
                            {"stub": stub, "args": args, "asyncio": asyncio, "run_ours": run_ours}, args.profile)
    finally:
        stub.stop()
    med = {side: {k: statistics.median(m[k] for m in ms) for k in ms[0]} for side, ms in rows.items()}
    ratio = {"calls_per_s": med["ours"]["calls_per_s"] / med["raw"]["calls_per_s"],
             "client_cpu": med["raw"]["client_cpu_ms"] / med["ours"]["client_cpu_ms"]}
    print(f"\n{args.calls} calls per round, concurrency {args.concurrency}, {args.rounds} rounds (medians); "
          f"{os.cpu_count()} CPUs visible, load average {os.getloadavg()[0]:.1f}\n")
    print("| client | calls/s (wall) | client CPU ms/call | client-CPU-bound calls/s | stub CPU ms/call |")
    print("|---|---|---|---|---|")
    for side in ("ours", "raw"):
        m = med[side]
        print(f"| {side} | {m['calls_per_s']:.0f} | {m['client_cpu_ms']:.3f} | {1000 / m['client_cpu_ms']:.0f} | {m['stub_cpu_ms']:.3f} |")
    print(f"\nratio ours/raw: wall calls/s {ratio['calls_per_s']:.2f}; CPU per call (raw/ours) {ratio['client_cpu']:.2f}")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump({"args": vars(args), "rounds": rows, "median": med, "ratio": ratio}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
