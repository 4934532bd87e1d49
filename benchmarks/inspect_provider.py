"""The nsbox Inspect provider against Inspect's `local` provider (and `docker` where it runs).

Rows, every variant interleaved in one process (round-robin), medians and p99s:
- `exec(["true"])` latency through each provider's SandboxEnvironment.exec;
- a sample's set-up and clean-up (sample_init, sample_cleanup) alone;
- samples per second of a whole `inspect_ai.eval()` with `mockllm` and a
  solver that runs five commands and a write_file/read_file per sample (the
  provider's cost), and of one whose solver calls text_editor and
  bash_session (Inspect installs and starts its tool server per sample).

Docker is measured only where `docker info` answers; otherwise its rows say
why not. Target (issue 38): set-up and clean-up under 5 ms each with a warm
Template behind the session (a Session starts its own sandbox today).

    python benchmarks/inspect_provider.py [-n 200] [--samples 40] [--tool-samples 8] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

Step = Callable[[], Awaitable[object]]


def docker_reason() -> str | None:
    """None if docker runs here, else why not."""
    if shutil.which("docker") is None:
        return "no docker command"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    return None if info.returncode == 0 else "docker info failed: " + (info.stderr.strip().splitlines() or ["?"])[-1]


async def measure(fns: dict[str, Step], n: int, warmup: int = 10) -> dict[str, list[float]]:
    """ms per awaited call of each variant, round-robin, each round starting one further on."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    order = list(fns.items())
    for i in range(warmup + n):
        k = i % len(order)
        for name, fn in order[k:] + order[:k]:
            t0 = time.perf_counter()
            await fn()
            if i >= warmup:
                times[name].append((time.perf_counter() - t0) * 1000)
    return times


async def exec_latency(providers: list[str], n: int) -> dict[str, list[float]]:
    """exec(["true"]) into one sample's environment of each provider."""
    from inspect_ai.util._sandbox.registry import registry_find_sandboxenv

    envs: dict[str, tuple[Any, dict[str, Any]]] = {}
    try:
        for name in providers:
            cls = registry_find_sandboxenv(name)
            await cls.task_init("bench", None)
            envs[name] = (cls, await cls.sample_init("bench", None, {}))

        def one(env: Any) -> Step:
            return lambda: env.exec(["true"])

        return await measure({name: one(e["default"]) for name, (_, e) in envs.items()}, n)
    finally:
        for cls, e in envs.values():
            await cls.sample_cleanup("bench", None, e, False)


async def setup_cleanup(providers: list[str], n: int) -> dict[str, list[float]]:
    """sample_init and sample_cleanup of each provider, each timed alone."""
    from inspect_ai.util._sandbox.registry import registry_find_sandboxenv

    pending: dict[str, Any] = {}

    def init(name: str) -> Step:
        cls = registry_find_sandboxenv(name)

        async def step() -> None:
            pending[name] = await cls.sample_init("bench", None, {})
        return step

    def cleanup(name: str) -> Step:
        cls = registry_find_sandboxenv(name)

        async def step() -> None:
            await cls.sample_cleanup("bench", None, pending.pop(name), False)
        return step

    steps: dict[str, Step] = {}
    for name in providers:  # init then cleanup of the same provider, next to each other
        steps[f"{name}: sample_init"] = init(name)
        steps[f"{name}: sample_cleanup"] = cleanup(name)
    times: dict[str, list[float]] = {k: [] for k in steps}
    for i in range(n + 5):
        for name in providers:
            for phase in ("sample_init", "sample_cleanup"):
                key = f"{name}: {phase}"
                t0 = time.perf_counter()
                await steps[key]()
                if i >= 5:
                    times[key].append((time.perf_counter() - t0) * 1000)
    return times


def samples_per_second(provider: str, samples: int, tools: bool = False) -> float:
    """A whole eval of `samples` samples (mockllm, a solver calling the sandbox), samples per second.
    `tools`: the solver calls Inspect's text_editor and bash_session instead (Inspect installs and starts
    its tool server in each sample's sandbox)."""
    from inspect_ai import Task, eval
    from inspect_ai.dataset import Sample
    from inspect_ai.solver import Generate, Solver, TaskState, solver
    from inspect_ai.tool import bash_session, text_editor
    from inspect_ai.util import sandbox

    @solver
    def commands() -> Solver:
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            box = sandbox()
            for _ in range(5):
                await box.exec(["true"])
            await box.write_file("note.txt", "hello")
            state.output.completion = await box.read_file("note.txt")
            return state
        return solve

    @solver
    def with_tools() -> Solver:
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            where = (await sandbox().exec(["pwd"])).stdout.strip()
            await text_editor()(command="create", path=f"{where}/note.txt", file_text="hello\n")
            state.output.completion = str(await bash_session()(action="type_submit", input="cat note.txt"))
            return state
        return solve

    task = Task(dataset=[Sample(input="go", id=i) for i in range(samples)],
                solver=with_tools() if tools else commands(), sandbox=provider)
    with tempfile.TemporaryDirectory(prefix="nsbox-bench.") as logs:
        t0 = time.perf_counter()
        (log,) = eval(task, model="mockllm/model", display="none", log_dir=logs, log_samples=False)
        elapsed = time.perf_counter() - t0
    if log.status != "success":
        raise RuntimeError(f"the {provider} eval failed: {log.error}")
    return samples / elapsed


def eval_rates(providers: list[str], samples: int, rounds: int, tools: bool = False) -> dict[str, float]:
    """The median samples/s of `rounds` evals per provider, interleaved, after a warm-up eval of each
    (a process's first eval pays Inspect's own start-up)."""
    for p in providers:
        samples_per_second(p, 2, tools)
    rates: dict[str, list[float]] = {p: [] for p in providers}
    for i in range(rounds):
        k = i % len(providers)
        for p in providers[k:] + providers[:k]:
            rates[p].append(samples_per_second(p, samples, tools))
    return {p: statistics.median(xs) for p, xs in rates.items()}


def table(title: str, times: dict[str, list[float]]) -> str:
    lines = [f"\n{title}\n", "| variant | median ms | p99 ms |", "|---|---|---|"]
    for name, xs in times.items():
        lines.append(f"| {name} | {statistics.median(xs):.2f} | {sorted(xs)[int(0.99 * (len(xs) - 1))]:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("-n", type=int, default=200, help="calls per latency variant")
    parser.add_argument("--samples", type=int, default=40, help="samples per eval")
    parser.add_argument("--tool-samples", type=int, default=8, help="samples per eval with Inspect's tools")
    parser.add_argument("--rounds", type=int, default=3, help="evals per provider (after one warm-up each)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    import sandbox.inspect  # noqa: F401  (registers nsbox, as the entry point does)

    providers = ["nsbox", "local"]
    reason = docker_reason()
    if reason is None:
        providers.append("docker")
    out: dict[str, Any] = {"docker": reason or "measured"}
    out["exec_true_ms"] = asyncio.run(exec_latency(providers, args.n))
    out["setup_cleanup_ms"] = asyncio.run(setup_cleanup(providers, max(20, args.n // 4)))
    out["samples_per_s"] = eval_rates(providers, args.samples, args.rounds)
    out["tool_samples_per_s"] = eval_rates(providers, args.tool_samples, args.rounds, tools=True)
    print(table("exec(['true'])", out["exec_true_ms"]))
    print(table("sample set-up and clean-up", out["setup_cleanup_ms"]))
    print(f"\nsamples per second (median of {args.rounds} evals of {args.samples} samples; 5 execs, "
          "a write_file and a read_file each):")
    for p, rate in out["samples_per_s"].items():
        print(f"  {p}: {rate:.1f}")
    print(f"\nsamples per second with Inspect's tools (median of {args.rounds} evals of {args.tool_samples} "
          "samples; text_editor create and bash_session each):")
    for p, rate in out["tool_samples_per_s"].items():
        print(f"  {p}: {rate:.2f}")
    if reason is not None:
        print(f"\ndocker: not measured ({reason})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
