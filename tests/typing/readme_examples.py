"""The Python examples of README.md and docs/*.md, as a user of the installed package writes them.

Each readme_example_N function's body is one ```python block of README.md, in
order; each docs_<page>_example_N one block of docs/<page>.md, page by page
(test_readme_examples.py checks both ways, and runs mypy --strict on this file
against the installed package). Nothing here runs: the names the examples
leave to the reader are defined first, with placeholder values.
"""

from __future__ import annotations

import sandbox

# ---------------------------------------------------------------- what the examples leave to the reader

spec = sandbox.presets.minimal_system()
workdir, path = "/home/me/work", "/home/me/work/tests"
submission, submissions = "print(1)", ["print(1)", "print(2)"]
rollout, rollouts = "print(1)", ["print(1)", "print(2)"]
tasks = ["print(1)"]


def grade(source: str) -> int:
    return len(source)


def score(source: str) -> int:
    return len(source)


def run_tests(where: str) -> bool:
    return bool(where)


# ---------------------------------------------------------------- the README's blocks, in order


def readme_example_1() -> None:
    import sandbox

    spec = sandbox.presets.minimal_system(             # /usr read-only with its links, /proc, /dev, a private /tmp
        sandbox.Bind("/home/me/work", "/work"),        # then your mounts: writable, under a new name
        cwd="/work", hostname="box",
        limits=sandbox.Limits(cpu_s=10, memory_mb=1024, cpu_cores=1.0, file_mb=100, nofile=256, nproc=256),
    )
    result = sandbox.run(["sh", "-c", "make test"], spec, capture_output=True, timeout=60)
    print(result.returncode, result.backend, result.backend_reason, result.timings)

    with sandbox.spawn(["sleep", "100"], spec) as proc:   # subprocess.Popen-shaped
        proc.kill()                                        # the whole sandbox, every process in it


def readme_example_2() -> None:
    with sandbox.Template(spec) as t:
        for task in tasks:
            done = t.run(["python3", "-c", task], capture_output=True, timeout=60,
                         binds=[sandbox.Bind(workdir, "/tmp/work")], cwd="/tmp/work", env={"TASK": "1"})


def readme_example_3() -> None:
    with sandbox.WorkerPool(spec, 4, preload=["json", "numpy"]) as pool:
        fut = pool.submit(grade, submission)           # a concurrent.futures.Executor
        print(fut.result(), fut.stdout, fut.stderr)    # what the task printed, per task
        pool.submit_task(run_tests, (path,), timeout=30, binds=[sandbox.Bind(workdir, "/work")], env={"SEED": "1"})


def readme_example_4() -> None:
    from sandbox import task

    sb = task.Sandbox(
        read=["/data/split-7"],                                   # read-only, at their own paths
        binds=[task.Bind("/runs/42/work", "/w", writable=True)],  # a host path under a name of its own
        env_allow=["LANG"], ports=[8080],                         # the host's tool server, forwarded inside
        probes=["/root/.ssh"],                                    # must be absent inside, or the start fails
        records="/runs/42/sandbox-records", role="task",
    )
    result = task.run(["python3", "agent.py", "--out=/runs/42/work/answer.json"], sb, capture_output=True)
    # argv becomes [..., "--out=/w/answer.json"]; result.record is what records/ received

def readme_example_5() -> None:
    import sandbox

    with sandbox.Session(sandbox.presets.minimal_system()) as session:
        session.write_file("/tmp/job.sh", b"echo started > /tmp/log\n")
        server = session.start(["python3", "-m", "http.server", "--bind", "127.0.0.1", "8000"])
        done = session.exec(["sh", "/tmp/job.sh"], timeout=10)   # a timeout kills this call's whole tree only
        print(done.returncode, session.read_file("/tmp/log"))
        server.kill()


# ---------------------------------------------------------------- docs/*.md's blocks, page by page, in order


def docs_images_example_1() -> None:
    from sandbox.images import ImageStore

    store = ImageStore()                                     # $SANDBOX_IMAGES, else ~/.cache/sandbox/images
    img = store.pull("registry.example.org/team/tool:1.4")   # HTTPS; anonymous or bearer-token auth
    local = store.load("build/oci-layout", "example.org/tool:dev")
    for layer in img.layers:                                 # bottom first
        print(layer.digest, layer.path, layer.whiteouts, layer.opaque)
    print(img.digest, img.config.env, img.config.working_dir, img.config.user, img.config.argv)
    store.remove("registry.example.org/team/tool:1.4")
    print(store.gc().layers)                                 # the layers no image uses any more


def docs_images_example_2() -> None:
    import sandbox
    from sandbox.images import ImageStore

    store = ImageStore()
    spec = sandbox.presets.image("example.org/tool:dev", store=store)    # a ref in the store, or an Image
    print(sandbox.run(["sh", "-c", "cat /etc/os-release"], spec, capture_output=True).stdout)
    kept = sandbox.presets.image(store.get("example.org/tool:dev"), writable="/var/tmp/tool-upper")
    with sandbox.Template(sandbox.presets.image("example.org/tool:dev", store=store)) as t:
        t.run(["/bin/true"])                      # ~1-2 ms, each sandbox its own writable layer: see Figures
    with sandbox.WorkerPool(sandbox.presets.image("example.org/py:3.11", store=store)) as pool:
        print(pool.submit(sum, [1, 2]).result())  # in the image's python3.11


def docs_limits_example_1() -> None:
    box = spec.replace(limits=sandbox.Limits(memory_mb=100, cpu_s=10))
    r = sandbox.run(["sh", "-c", "python3 -c 'x = b\"x\" * (300 << 20)'; ls"], box, capture_output=True)
    print(r.returncode, r.killed_by, r.usage)   # 0 memory Usage(mechanism='cgroup2', ..., events={'oom_kill': 1, ...})


def docs_output_example_1() -> None:
    from sandbox.output import OutputLimitError

    r = sandbox.run(["python3", "-c", "print('x' * 10**9)"], spec, capture_output=True, max_output=1 << 20)
    print(len(r.stdout), r.stdout_dropped)                  # 1048576 998951425: the last MiB, and the rest counted
    try:
        sandbox.run(["python3", "-c", "print('x' * 10**9)"], spec, capture_output=True, max_output=1 << 20,
                    on_overflow="raise")
    except OutputLimitError as exc:
        print(len(exc.stdout or b""), exc.killed_by)        # 1048576 output: the first MiB, the sandbox killed


def docs_python_api_example_1() -> None:
    import sandbox

    spec = sandbox.presets.minimal_system(             # /usr read-only with its links, /proc, /dev, a private /tmp
        sandbox.Bind("/home/me/work", "/work"),        # then your mounts: writable, under a new name
        cwd="/work", hostname="box",
        limits=sandbox.Limits(cpu_s=10, memory_mb=1024, cpu_cores=1.0, file_mb=100, nofile=256, nproc=256),
    )
    result = sandbox.run(["sh", "-c", "make test"], spec, capture_output=True, timeout=60)
    print(result.returncode, result.backend, result.backend_reason, result.timings)

    with sandbox.spawn(["sleep", "100"], spec) as proc:   # subprocess.Popen-shaped
        proc.kill()                                        # the whole sandbox, every process in it


def docs_python_api_example_2() -> None:
    spec = sandbox.Spec(
        mounts=[
            sandbox.RoBind("/usr"),
            sandbox.Symlink("usr/bin", "/bin"), sandbox.Symlink("usr/lib", "/lib"),
            sandbox.Symlink("usr/lib64", "/lib64"),
            sandbox.Proc(), sandbox.Dev(), sandbox.Tmpfs("/tmp"),
            sandbox.Bind("/home/me/work", "/work"),
        ],
        env={"PATH": "/usr/local/bin:/usr/bin:/bin"}, env_inherit=["LANG", "LC_*"],
        cwd="/work", hostname="box",
    )


def docs_python_api_example_3() -> None:
    import asyncio

    import sandbox


    async def main() -> None:
        spec = sandbox.presets.minimal_system()
        done = await sandbox.arun(["sh", "-c", "echo hi"], spec, capture_output=True, text=True, timeout=10)
        proc = await sandbox.aspawn(["cat"], spec, stdin=sandbox.PIPE, stdout=sandbox.PIPE)
        out, _ = await proc.communicate(b"fed")       # an AsyncProcess: await wait(), communicate()
        print(done.stdout, out, proc.returncode)


    asyncio.run(main())

def docs_ray_example_1() -> None:
    import ray

    import sandbox
    from sandbox.ray import RayPool

    ray.init(address="auto")                      # the running cluster (ray.init() alone starts a local one)
    spec = sandbox.presets.minimal_system()       # paths are the nodes' paths
    with RayPool(spec, 8, preload=["json"], timeout=60) as pool:
        futures = [pool.submit(score, rollout) for rollout in rollouts]
        for f in futures:
            print(f.result(), f.node_id, f.stdout)  # value, the node that ran it, what the task printed
        pool.submit_task(run_tests, (path,), timeout=30, env={"SEED": "1"},
                         binds=[sandbox.Bind("/data/job-7", "/work")])   # the node's /data/job-7


def docs_session_example_1() -> None:
    import sandbox

    spec = sandbox.presets.minimal_system()
    with sandbox.Session(spec) as session:
        session.exec(["sh", "-c", "echo 1 > /tmp/count"])
        done = session.exec(["cat", "/tmp/count"], capture_output=True, text=True, timeout=10)
        print(done.returncode, done.stdout)          # 0 "1\n": the file is still there


def docs_session_example_2() -> None:
    import subprocess

    import sandbox

    with sandbox.Session(sandbox.presets.minimal_system()) as session:
        server = session.start(["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        page = session.exec(["python3", "-c", "import urllib.request, time; time.sleep(1); "
                             "print(urllib.request.urlopen('http://127.0.0.1:8000/').status)"],
                            capture_output=True, text=True, timeout=30)
        server.kill()                                # the server and everything it started
        server.wait()


def docs_session_example_3() -> None:
    import subprocess

    import sandbox

    with sandbox.Session(sandbox.presets.minimal_system()) as session:
        session.exec(["sh", "-c", "sleep 1000 > /dev/null 2>&1 &"])     # ends normally: its sleep keeps running
        try:
            session.exec(["sh", "-c", "setsid sleep 1000 & sleep 1000"], timeout=1)
        except subprocess.TimeoutExpired:
            pass                                     # both sleeps of this call are gone; the first call's is not


def docs_session_example_4() -> None:
    import sandbox

    with sandbox.Session(sandbox.presets.minimal_system()) as session:
        session.write_file("/tmp/work/input.txt", b"data\n", mode=0o600, parents=True)
        session.exec(["sh", "-c", "tr a-z A-Z < /tmp/work/input.txt > /tmp/work/out.txt"])
        print(session.read_file("/tmp/work/out.txt", max_bytes=1 << 20))   # b"DATA\n"


def docs_session_example_5() -> None:
    import asyncio

    import sandbox


    async def main(session: sandbox.Session) -> None:
        done = await session.aexec(["sh", "-c", "echo hi"], capture_output=True, timeout=10)
        proc = await session.astart(["cat"], stdin=sandbox.PIPE, stdout=sandbox.PIPE)
        out, _ = await proc.communicate(b"fed")
        task = asyncio.create_task(session.aexec(["sleep", "1000"]))
        await asyncio.sleep(0.1)
        task.cancel()                                # the sleep's whole tree is killed
        print(done.stdout, out)


    with sandbox.Session(sandbox.presets.minimal_system()) as s:
        asyncio.run(main(s))


def docs_session_example_6() -> None:
    import sandbox

    spec = sandbox.presets.minimal_system(sandbox.RoBind("/etc"))
    with sandbox.Session(spec, upper="/var/tmp/my-session") as session:     # omit upper: the writes are in memory
        session.exec(["sh", "-c", "echo 'tool:x:1001:1001::/tmp:/bin/sh' >> /etc/passwd"], check=True)
        session.write_file("/usr/local/bin/tool", b"#!/bin/sh\necho installed\n", mode=0o755)
        print(session.exec(["tool"], capture_output=True, text=True).stdout)   # "installed\n"
    # the host's /etc/passwd and /usr/local/bin are unchanged; the writes are in /var/tmp/my-session


def docs_session_example_7() -> None:
    import sandbox

    passwd = "root:x:0:0::/root:/bin/sh\nalice:x:1000:1000::/tmp:/bin/sh\n"
    spec = sandbox.presets.minimal_system(sandbox.File("/etc/passwd", passwd, perms=0o644),
                                          sandbox.File("/etc/group", "root:x:0:\nalice:x:1000:\n", perms=0o644))
    with sandbox.Session(spec) as session:
        print(session.ids.words())                   # "range 65536 (root)", "range 65537 (newuidmap)" or "one id"
        done = session.exec(["id"], user="alice", capture_output=True, text=True, timeout=10)
        print(done.stdout)                           # uid=1000(alice) gid=1000(alice) groups=1000(alice)


def docs_session_example_8() -> None:
    import sandbox

    with sandbox.Session(sandbox.presets.minimal_system()) as session:
        ident = session.publish()                     # now: sandbox exec IDENT -- bash -l, from your shell
        input(f"sandbox exec {ident} -- bash -l; press Enter to close it ")

def docs_task_example_1() -> None:
    import os

    from sandbox import task

    workdir, key = "/runs/42/work", os.environ["MODEL_KEY"]
    sb = task.Sandbox(
        read=["/data/split-7"],                                 # read-only, at their own paths
        binds=[task.Bind(workdir, "/w", writable=True)],        # a host path under a name of its own
        layout=task.Layout(workdir, "/w"), chdir=workdir,       # chdir is a host path: translated to /w
        framework_package="trainer", hide=["trainer_tools.scoring"],  # covered, under every name, never imported
        env_allow=["MWM_*", "LANG"], env={"MODEL_KEY": key},
        ports=[8080],                                           # the host's tool server, forwarded inside
        proxy=task.Proxy(allowed_hosts=["api.example.com"]),    # HTTP(S)_PROXY set inside; other hosts get 403
        limits=task.Limits(memory_mb=4096, cpu_s=600),
        probes=[os.path.expanduser("~/.ssh")],                  # must be absent inside, or the start fails
        records="/runs/42/sandbox-records", role="task",
    )
    result = task.run(["python3", "agent.py", f"--out={workdir}/answer.json"], sb, capture_output=True)
    # argv becomes ["python3", "agent.py", "--out=/w/answer.json"]; result.record is what records/ received
    answer = task.outside(sb, "answer.json")                   # the host path of what the learner names
    task.sanitized_copy(answer, "/runs/42/handoff/answer.json")  # handoffs leave as sanitized copies


def docs_template_example_1() -> None:
    with sandbox.Template(spec) as t:
        for task in tasks:
            done = t.run(["python3", "-c", task], capture_output=True, timeout=60,
                         binds=[sandbox.Bind(workdir, "/tmp/work")], cwd="/tmp/work", env={"TASK": "1"})


def docs_template_example_2() -> None:
    import concurrent.futures

    with sandbox.Template(spec) as t, concurrent.futures.ThreadPoolExecutor(8) as threads:
        results = list(threads.map(lambda task: t.run(["python3", "-c", task], capture_output=True), tasks))


def docs_template_example_3() -> None:
    with sandbox.Template(spec) as t:
        r = t.run(["python3", "-c", "print('x' * 10**7)"], capture_output=True, max_output=1 << 20)
        print(len(r.stdout), r.stdout_dropped)   # 1048576 and the rest counted


def docs_template_example_4() -> None:
    with sandbox.Template(spec, recycle=True) as t:
        for task in tasks:
            t.run(["python3", "-c", task], capture_output=True, timeout=60)


def docs_workerpool_example_1() -> None:
    with sandbox.WorkerPool(spec, 4, preload=["json", "numpy"]) as pool:
        fut = pool.submit(grade, submission)           # a concurrent.futures.Executor
        print(fut.result(), fut.stdout, fut.stderr)    # what the task printed, per task
        pool.submit_task(run_tests, (path,), timeout=30, binds=[sandbox.Bind(workdir, "/work")], env={"SEED": "1"})


def docs_workerpool_example_2() -> None:
    import ray

    from sandbox.ray import RayPool

    ray.init()                  # a local Ray (one machine); on a running cluster: ray.init(address="auto")
    with RayPool(spec, 8, preload=["json"]) as pool:
        results = list(pool.map(grade, submissions))

# ---------------------------------------------------------------- the README's inline examples

def readme_inline_examples() -> None:
    """The calls the README's prose shows in `code` (checked by mypy only)."""
    import pathlib
    import sys

    code = "print(1)"
    sandbox.run([sys.executable, "-c", code], sandbox.presets.python_interpreter())
    sandbox.presets.host_view(writable=["/home/me/work"])
    sandbox.Spec(forward={8080: 9000, 5432: "/run/postgresql/.s.PGSQL.5432"}, check_network=True,
                 probe_paths=["/etc/shadow", pathlib.Path.home() / ".ssh"])
    sandbox.Spec(mounts=[sandbox.Bind(pathlib.Path("/home/me/work"), "/work")], cwd=pathlib.Path("/work"))
    sandbox.Spec(seccomp=sandbox.Seccomp(deny=["ptrace"], errno="EPERM", errnos={"clone3": "ENOSYS"},
                                         rules=[sandbox.ArgRule("ioctl", 1, "eq", 0x5412)]))
    sandbox.Spec(seccomp=sandbox.Seccomp(allow=["read", "write", "exit_group"], default="kill"))


def docs_inspect_example_1() -> None:
    from inspect_ai import Task, eval
    from inspect_ai.dataset import Sample
    from inspect_ai.scorer import includes
    from inspect_ai.solver import generate, use_tools
    from inspect_ai.tool import bash_session, text_editor

    task = Task(
        dataset=[Sample(input="Write hello.py printing 'hello', run it, and answer with its output.",
                        target="hello")],
        solver=[use_tools(bash_session(), text_editor()), generate()],
        scorer=includes(),
        sandbox=("nsbox", "nsbox.yaml"),     # or sandbox="nsbox": the defaults below
    )
    eval(task, model="openai/gpt-4o")
