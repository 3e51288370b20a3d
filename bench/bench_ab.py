"""A/B: chatstream at several commits, and the peer, measured side by side in one run.

Run: ``.venv/bin/python bench/bench_ab.py --variant base=HEAD --variant httpcore=ab/httpcore
[--loop uvloop] [--database postgres|sqlite] [--rounds 3]``   (not a test; see bench/README.md)

Each variant is a git commit, checked out in its own worktree and served by its own uvicorn
worker (``--http httptools`` and the given ``--loop``), beside the peer (bench/bare_proxy.py)
and the simulated upstream; the fixtures are made with this checkout's models, so the variants
must share its migrations. Every round measures every path, in a new random order each time,
so the machine's noise falls on all of them alike; the figures that decide are ratios within a
round:

- **TTFT**: one stream at a time, every path in turn (``--ttft-trials`` times); the time to the
  first delta minus the direct call's in the same trial, p50.
- **CPU per 1,000 deltas**: ``--load`` streams of ``--tokens`` deltas at 20 deltas/s; the
  worker's user + system CPU over the deltas delivered, and the p99 gap between reads.
- **Memory per stream**: RSS with ``--memory`` streams open, minus RSS at rest, per stream; in
  the first round only, on workers that have carried no load yet (RSS does not shrink after a
  load, so later rounds would reuse what earlier steps left).
- **Capacity** (``--steps``, optional): the largest step every stream of which completed with
  a p99 gap under 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import bench_proxy as bp
import loadgen

ROOT = bp.ROOT
PEER = "peer"


def worktree(ref: str, into: Path) -> Path:
    """A detached checkout of ``ref`` (the working tree itself for ``.``)."""
    if ref == ".":
        return ROOT
    path = into / ref.replace("/", "-")
    subprocess.run(["git", "worktree", "add", "--detach", "--force", str(path), ref], cwd=ROOT,
                   check=True, capture_output=True)
    return path


def remove_worktrees(paths: Iterable[Path]) -> None:
    """Remove the checkouts :func:`worktree` made (never the working tree itself)."""
    for path in paths:
        if path != ROOT:
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT,
                           check=False)


def serve(name: str, app: str, env: dict[str, str], logdir: Path, *, cwd: Path, probe: str,
          loop: str) -> bp.Proc:
    port = bp.free_port()
    argv = [sys.executable, "-m", "uvicorn", app, "--host", bp.HOST, "--port", str(port),
            "--no-access-log", "--log-level", "warning", "--backlog", "4096",
            "--http", "httptools", "--loop", loop]
    return bp.Proc(name, argv, {**env, "PYTHONPATH": str(cwd)}, port, logdir, probe=probe,
                   cwd=cwd).start()


def specs_for(paths: bp.Paths, name: str, port: int, n: int, tokens: int) -> list[loadgen.Spec]:
    if name == PEER:
        return [paths.bare(port, tokens) for _ in range(n)]
    return paths.chatstream(port, n, tokens)


async def ttft(paths: bp.Paths, ports: dict[str, int], trials: int) -> dict[str, float]:
    added: dict[str, list[float]] = {name: [] for name in ports}
    for _ in range(trials):
        order = ["direct", *ports]
        random.shuffle(order)
        got: dict[str, float] = {}
        for name in order:
            if name == "direct":
                spec, port = paths.direct(3), paths.sim
            else:
                port = ports[name]
                spec = specs_for(paths, name, port, 1, 3)[0]
            [result] = await loadgen.run(bp.HOST, port, [spec], timeout=10)
            if result.ttft is None:
                raise RuntimeError(f"{name} gave no token: {result.error or result.status}")
            got[name] = result.ttft
            await asyncio.sleep(0.02)
        for name in ports:
            added[name].append(got[name] - got["direct"])
    return {name: 1000 * statistics.median(values) for name, values in added.items()}


async def load(paths: bp.Paths, servers: dict[str, bp.Proc], c: int, tokens: int
               ) -> dict[str, bp.Step]:
    out = {}
    order = list(servers)
    random.shuffle(order)
    for name in order:
        proc = servers[name]
        specs = specs_for(paths, name, proc.port, c, tokens)
        out[name] = await bp.load_step(name, proc.port, specs, proc,
                                       timeout=tokens / bp.TPS + 30)
        proc.wait_idle()
        bp.sim_reset(paths.sim)
    return out


async def memory(paths: bp.Paths, servers: dict[str, bp.Proc], n: int) -> dict[str, float]:
    out = {}
    order = list(servers)
    random.shuffle(order)
    for name in order:
        proc = servers[name]
        got = await bp.memory(name, proc, proc.port, specs_for(paths, name, proc.port, n, 600))
        out[name] = got["per_kb"]
        proc.wait_idle()
        bp.sim_reset(paths.sim)
    return out


async def capacity(paths: bp.Paths, servers: dict[str, bp.Proc], steps: list[int],
                   tokens: int) -> dict[str, int]:
    best = dict.fromkeys(servers, 0)
    failed: set[str] = set()
    for c in steps:
        live = {n: p for n, p in servers.items() if n not in failed}
        if not live:
            break
        for name, step in (await load(paths, live, c, tokens)).items():
            if step.passed:
                best[name] = c
            else:
                failed.add(name)
    return best


async def run(options: argparse.Namespace, variants: dict[str, Path], logdir: Path
              ) -> list[dict[str, Any]]:
    sim = bp.Proc("simulator", [sys.executable, "-m", "chatstream.testing", "--port",
                                str(port := bp.free_port())], {}, port, logdir,
                  probe="/v1/models").start()
    procs = [sim]
    rounds: list[dict[str, Any]] = []
    with bp.running(procs):
        fixtures = bp.Fixtures()
        paths = bp.Paths(sim.port, fixtures)
        servers: dict[str, bp.Proc] = {}
        for name, path in variants.items():
            servers[name] = serve(name, "project.asgi:application",
                                  bp.chatstream_env(sim.port, redis=False), logdir, cwd=path,
                                  probe="/accounts/login/", loop=options.loop)
            procs.append(servers[name])
        servers[PEER] = serve(PEER, "bench.bare_proxy:app", bp.bare_env(sim.port), logdir,
                              cwd=ROOT, probe="/stream", loop=options.loop)
        procs.append(servers[PEER])
        ports = {name: proc.port for name, proc in servers.items()}
        for name, port in ports.items():  # imports, pools
            results = await loadgen.run(bp.HOST, port, specs_for(paths, name, port, 20, 5),
                                        spread=0.5, timeout=20)
            if failed := [r.error or r.status for r in results if r.error or not r.complete]:
                raise RuntimeError(f"warm-up of {name} failed: {failed[:3]}")
        for number in range(1, options.rounds + 1):
            bp.log(f"== round {number} of {options.rounds}")
            got: dict[str, Any] = {}
            if options.memory and number == 1:  # RSS only grows: measured on fresh workers
                got["memory"] = await memory(paths, servers, options.memory)
            got["ttft"] = await ttft(paths, ports, options.ttft_trials)
            bp.log(f"TTFT added p50 (ms): {fmt(got['ttft'])}")
            steps = await load(paths, servers, options.load, options.tokens)
            got["cpu"] = {n: s.cpu_per_1000 for n, s in steps.items()}
            got["gap"] = {n: s.summary["gap_p99_ms"] for n, s in steps.items()}
            got["complete"] = {n: s.complete for n, s in steps.items()}
            if options.steps:
                got["capacity"] = await capacity(
                    paths, servers, [int(c) for c in options.steps.split(",")], options.tokens)
            rounds.append(got)
            bp.log(json.dumps(got))
    return rounds


def fmt(values: dict[str, float], digits: int = 2) -> str:
    return ", ".join(f"{name} {value:.{digits}f}" for name, value in values.items())


def report(rounds: list[dict[str, Any]], names: list[str], setup: str) -> str:
    base = names[0]
    lines = [f"{setup}; {len(rounds)} rounds; each cell: the rounds' values, then the median "
             f"ratio to {base} (lower is better except capacity)", "",
             "| figure | " + " | ".join(names) + " |",
             "| --- |" + " --- |" * len(names)]
    figures = [("TTFT added over direct, p50 (ms)", "ttft"),
               ("CPU s per 1,000 deltas", "cpu"), ("p99 gap between reads (ms)", "gap"),
               ("memory per stream (KB)", "memory"), ("capacity (streams)", "capacity")]
    for title, key in figures:
        measured = [r for r in rounds if key in r]
        if not measured:
            continue
        cells = []
        for name in names:
            values = [r[key][name] for r in measured]
            ratios = [r[key][name] / r[key][base] for r in measured if r[key][base]]
            shown = " / ".join(f"{v:.2f}" if key in ("ttft", "cpu") else f"{v:.0f}"
                               for v in values)
            cells.append(f"{shown} ({statistics.median(ratios):.2f}×)" if ratios else shown)
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=REF",
                        help="a chatstream commit to measure (repeat); the first is the base; "
                        "REF '.' is the working tree")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="uvloop")
    parser.add_argument("--database", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ttft-trials", type=int, default=100)
    parser.add_argument("--load", type=int, default=100, help="streams for the CPU figure")
    parser.add_argument("--tokens", type=int, default=200, help="deltas per stream (20/s)")
    parser.add_argument("--memory", type=int, default=200, help="open streams (0: skip)")
    parser.add_argument("--steps", default="", help="capacity steps, e.g. 200,250,300")
    options = parser.parse_args()
    variants = dict(v.split("=", 1) for v in options.variant) or {"working-tree": "."}
    logdir = Path(tempfile.mkdtemp(prefix="bench-ab-"))
    trees = {name: worktree(ref, logdir) for name, ref in variants.items()}
    if options.database == "sqlite":
        bp.DATABASE_URL = f"sqlite:///{logdir / 'bench.sqlite3'}"
        bp.migrate()
    else:
        bp.create_database()
    bp.setup_django()
    bp.log(f"logs in {logdir}; variants {variants}")
    started = time.monotonic()
    try:
        rounds = asyncio.run(run(options, trees, logdir))
    finally:
        remove_worktrees(trees.values())
        if options.database == "postgres":
            bp.drop_database()
    setup = (f"{time.strftime('%Y-%m-%d %H:%M')}, {options.database}, uvicorn --loop "
             f"{options.loop} --http httptools, {options.load} streams × {options.tokens} deltas "
             f"for CPU, {options.ttft_trials} TTFT trials, {time.monotonic() - started:.0f} s")
    print()
    print(report(rounds, [*variants, PEER], setup))
    (logdir / "rounds.json").write_text(json.dumps(rounds, indent=1))


if __name__ == "__main__":
    main()
