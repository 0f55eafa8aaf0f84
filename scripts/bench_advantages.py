#!/usr/bin/env python
"""Benchmark: vectorised ``compute_advantages`` vs Python-loop implementations of the same estimator.

Synthetic batches like training: n = 8 trajectories per uid, 2-3 agents per uid, each agent acting
1-4 times per trajectory, 0/1 trajectory rewards, 10% of rows penalised 0.1, rows shuffled.

Two loop baselines, both computing the same estimator (``grpo`` or ``drmas``):

* **reference-style loop**: the shape of the reference implementation: a Python loop over rows
  that indexes torch tensors (``scores[i]``), groups them in dicts of lists, takes
  ``torch.mean`` / ``torch.std`` per group and writes ``scores[i] = ...`` back row by row.
* **pure-Python loop**: the fastest straightforward loop: ``.tolist()`` once, then dicts of lists
  of Python floats and plain sums (what the tests use as their reference).

A loop whose projected time for a size exceeds ``--loop-budget`` seconds (default 60) is timed on a
subsample of whole uids and extrapolated linearly in rows; the table says so. Every loop result is
compared with the vectorised one on the rows it ran on ("max |diff|").

Example::

    python scripts/bench_advantages.py                       # 10k, 100k, 1M rows, grpo and drmas
    python scripts/bench_advantages.py --sizes 10k,100k --estimators drmas --threads 2
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import defaultdict
from collections.abc import Callable

import torch
from tabulate import tabulate

from drmas_trainer.advantages import compute_advantages

EPS = 1e-6

# ------------------------------------------------------------------------------------------------
# synthetic batches
# ------------------------------------------------------------------------------------------------


def make_batch(n_rows: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """About ``n_rows`` rows (exactly, the last uid may be cut) of 8 trajectories per uid."""
    g = torch.Generator().manual_seed(seed)
    n_uid = max(1, math.ceil(n_rows / 40))  # ~50 rows per uid on average; cut below
    n_traj = n_uid * 8
    agents_per_uid = torch.randint(2, 4, (n_uid,), generator=g)  # 2 or 3
    slot_uid = torch.arange(n_traj).repeat_interleave(3) // 8  # (trajectory, agent slot) pairs
    slot_agent = torch.arange(3).repeat(n_traj)
    acting = slot_agent < agents_per_uid[slot_uid]
    times = torch.randint(1, 5, (n_traj * 3,), generator=g) * acting  # 1-4 rows per acting agent
    traj = torch.arange(n_traj).repeat_interleave(3).repeat_interleave(times)
    agent = slot_agent.repeat_interleave(times)
    uid = traj // 8
    reward = (torch.rand(n_traj, generator=g) < 0.5).float()
    scores = reward[traj] - 0.1 * (torch.rand(traj.numel(), generator=g) < 0.1).float()
    if traj.numel() < n_rows:
        raise RuntimeError("generator produced too few rows")  # ~50 rows/uid > 40 assumed
    keep = slice(0, n_rows)
    perm = torch.randperm(n_rows, generator=g)
    return scores[keep][perm], uid[keep][perm] * 13 + 5, traj[keep][perm] * 7 + 1, agent[keep][perm]


def subsample_uids(batch, max_rows: int) -> tuple:
    """The rows of the first uids (in sorted order) totalling at most ``max_rows`` rows."""
    scores, uid, traj, agent = batch
    ids, counts = torch.unique(uid, return_counts=True)
    n_keep = max(1, int((torch.cumsum(counts, 0) <= max_rows).sum()))
    sel = torch.isin(uid, ids[:n_keep])
    return scores[sel], uid[sel], traj[sel], agent[sel]


# ------------------------------------------------------------------------------------------------
# loop baselines
# ------------------------------------------------------------------------------------------------


def _ref_norm(vals: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    if len(vals) == 1:
        return torch.tensor(0.0), torch.tensor(1.0)
    t = torch.stack(vals)
    return torch.mean(t), torch.std(t)


def loop_refstyle_drmas(scores, uid, traj, agent) -> torch.Tensor:
    """Reference-style loop, agent-wise statistics per (uid, agent)."""
    scores = scores.clone()
    id2score: dict[tuple[int, int], list[torch.Tensor]] = defaultdict(list)
    bsz = scores.shape[0]
    for i in range(bsz):
        id2score[(int(uid[i]), int(agent[i]))].append(scores[i])
    id2stat = {key: _ref_norm(vals) for key, vals in id2score.items()}
    for i in range(bsz):
        mean, std = id2stat[(int(uid[i]), int(agent[i]))]
        scores[i] = (scores[i] - mean) / (std + EPS)
    return scores


def loop_refstyle_grpo(scores, uid, traj, agent) -> torch.Tensor:
    """Reference-style loop, trajectory mean normalised over the uid's trajectories."""
    scores = scores.clone()
    bsz = scores.shape[0]
    traj2score: dict[int, list[torch.Tensor]] = defaultdict(list)
    traj2uid: dict[int, int] = {}
    for i in range(bsz):
        traj2score[int(traj[i])].append(scores[i])
        traj2uid[int(traj[i])] = int(uid[i])
    traj2value = {t: torch.mean(torch.stack(v)) for t, v in traj2score.items()}
    id2score: dict[int, list[torch.Tensor]] = defaultdict(list)
    for t, v in traj2value.items():
        id2score[traj2uid[t]].append(v)
    id2stat = {key: _ref_norm(vals) for key, vals in id2score.items()}
    for i in range(bsz):
        mean, std = id2stat[int(uid[i])]
        scores[i] = (traj2value[int(traj[i])] - mean) / (std + EPS)
    return scores


def _py_stats(vals: list[float]) -> tuple[float, float]:
    n = len(vals)
    if n == 1:
        return 0.0, 1.0
    m = sum(vals) / n
    return m, math.sqrt(sum((v - m) ** 2 for v in vals) / (n - 1))


def loop_python_drmas(scores, uid, traj, agent) -> torch.Tensor:
    """Pure-Python loop over lists of floats, agent-wise statistics."""
    x, u, k = scores.tolist(), uid.tolist(), agent.tolist()
    groups: dict[tuple[int, int], list[float]] = defaultdict(list)
    for i in range(len(x)):
        groups[(u[i], k[i])].append(x[i])
    stats = {key: _py_stats(v) for key, v in groups.items()}
    out = []
    for i in range(len(x)):
        m, s = stats[(u[i], k[i])]
        out.append((x[i] - m) / (s + EPS))
    return torch.tensor(out, dtype=torch.float32)


def loop_python_grpo(scores, uid, traj, agent) -> torch.Tensor:
    """Pure-Python loop over lists of floats, trajectory values normalised over the uid."""
    x, u, t = scores.tolist(), uid.tolist(), traj.tolist()
    traj_vals: dict[int, list[float]] = defaultdict(list)
    traj_uid: dict[int, int] = {}
    for i in range(len(x)):
        traj_vals[t[i]].append(x[i])
        traj_uid[t[i]] = u[i]
    value = {tt: sum(v) / len(v) for tt, v in traj_vals.items()}
    groups: dict[int, list[float]] = defaultdict(list)
    for tt, v in value.items():
        groups[traj_uid[tt]].append(v)
    stats = {key: _py_stats(v) for key, v in groups.items()}
    out = []
    for i in range(len(x)):
        m, s = stats[u[i]]
        out.append((value[t[i]] - m) / (s + EPS))
    return torch.tensor(out, dtype=torch.float32)


LOOPS: dict[str, dict[str, Callable]] = {
    "drmas": {"reference-style": loop_refstyle_drmas, "pure-Python": loop_python_drmas},
    "grpo": {"reference-style": loop_refstyle_grpo, "pure-Python": loop_python_grpo},
}

# ------------------------------------------------------------------------------------------------
# timing
# ------------------------------------------------------------------------------------------------


def best_time(fn: Callable[[], object], repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def time_loop(loop: Callable, batch, estimator: str, budget_s: float, probe_rows: int) -> tuple[float, int, float]:
    """(seconds for the full batch, rows actually run, max |diff| vs vectorised on those rows)."""
    n = batch[0].numel()
    probe = subsample_uids(batch, min(n, probe_rows))
    t0 = time.perf_counter()
    out = loop(*probe)
    probe_s = time.perf_counter() - t0
    ran = probe
    if probe[0].numel() < n:
        projected = probe_s * n / probe[0].numel()
        if projected <= budget_s:
            t0 = time.perf_counter()
            out = loop(*batch)
            probe_s = time.perf_counter() - t0
            ran = batch
        else:  # grow the subsample to ~1/4 of the budget, then extrapolate
            rows = int(probe[0].numel() * (budget_s / 4) / max(probe_s, 1e-9))
            if rows > probe[0].numel():
                ran = subsample_uids(batch, rows)
                t0 = time.perf_counter()
                out = loop(*ran)
                probe_s = time.perf_counter() - t0
    rows_run = ran[0].numel()
    diff = float((out - compute_advantages(*ran, estimator=estimator)).abs().max())
    return probe_s * n / rows_run, rows_run, diff


def parse_size(text: str) -> int:
    text = text.strip().lower()
    mult = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


def fmt_rows(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1e3:g}k" if n >= 1000 else str(n)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="example: python scripts/bench_advantages.py --sizes 10k,100k,1M")
    ap.add_argument("--sizes", default="10k,100k,1M", help="comma-separated row counts, k/M suffixes (default 10k,100k,1M)")
    ap.add_argument("--estimators", default="grpo,drmas", help="comma-separated, from: grpo, drmas (default both)")
    ap.add_argument("--loop-budget", type=float, default=60.0, help="max seconds for one loop run before extrapolating (default 60)")
    ap.add_argument("--repeats", type=int, default=3, help="vectorised timing: best of this many runs (default 3)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1, like the single-threaded loops)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    estimators = [e.strip() for e in args.estimators.split(",") if e.strip()]
    for e in estimators:
        if e not in LOOPS:
            ap.error(f"no loop baseline for estimator {e!r}; choose from {', '.join(LOOPS)}")

    rows_out = []
    notes: list[str] = []
    for n in sizes:
        batch = make_batch(n, seed=args.seed)
        for est in estimators:
            compute_advantages(*batch, estimator=est)  # warm-up
            vec_s = best_time(lambda: compute_advantages(*batch, estimator=est), args.repeats)
            row = [est, fmt_rows(n), f"{vec_s * 1e3:.3g}", f"{n / vec_s:,.0f}"]
            for name, loop in LOOPS[est].items():
                loop_s, ran, diff = time_loop(loop, batch, est, args.loop_budget, probe_rows=10_000)
                mark = "" if ran == n else f" (*{len(notes) + 1})"
                if ran != n:
                    notes.append(f"{name} loop, {est}, {fmt_rows(n)} rows: timed on {ran:,} rows (whole uids), extrapolated linearly")
                row += [f"{loop_s:.3g}{mark}", f"{n / loop_s:,.0f}", f"{loop_s / vec_s:,.0f}x", f"{diff:.1e}"]
            rows_out.append(row)
            print(f"done: {est} {fmt_rows(n)}", file=sys.stderr, flush=True)

    headers = ["estimator", "rows", "vectorised ms", "rows/s"]
    for name in ("ref-style loop", "pure-Python loop"):
        headers += [f"{name} s", "rows/s", "speed-up", "max |diff|"]
    print(tabulate(rows_out, headers=headers, stralign="right"))
    for i, note in enumerate(notes, 1):
        print(f"(*{i}) {note}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); vectorised = best of {args.repeats}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
