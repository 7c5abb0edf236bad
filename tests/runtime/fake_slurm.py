"""A Slurm of one machine for the tests: `sbatch`, `squeue`, `sacct`, `scancel`, `srun` and
`scontrol` as executables in a folder put first on PATH.

What it keeps of the real thing: `sbatch --parsable` prints a job id and runs the script in the
background with SLURM_JOB_ID, SLURM_JOB_NODELIST and SLURM_JOB_NUM_NODES set, output to --output;
`squeue` lists a job while it runs and not after; `sacct -P` gives `State|ExitCode`; `srun` starts
one task per node (SLURM_STEP_ID, SLURM_NODEID set) and with --kill-on-bad-exit kills the step when
a task fails; `scancel --signal=SIG` signals every process of the job's steps, plain `scancel`
kills every process of the job. "Of the job" is what a cgroup would say; here, whoever carries the
job's SLURM_JOB_ID and this fake's state folder (FAKE_SLURM_STATE) in its environment
(torchrun's workers inherit both): every test's fake numbers its first job FIRST_JOB_ID, and a
test on another pytest worker must never signal this one's ranks. Every node is 127.0.0.1.
Every call is appended to `calls.jsonl` in the state folder, the tasks of a job to its `tasks`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

TOOLS = ("sbatch", "squeue", "sacct", "scancel", "srun", "scontrol")
FIRST_JOB_ID = 4000


def install(bin_dir: Path, state_dir: Path) -> None:
    """One executable per tool, each calling `main` of this file with the state folder."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "jobs").mkdir(parents=True, exist_ok=True)
    for tool in TOOLS:
        path = bin_dir / tool
        path.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                        f"import fake_slurm\nsys.exit(fake_slurm.main({tool!r}, {str(state_dir)!r}, sys.argv[1:]))\n")
        path.chmod(0o755)


def calls(state_dir: Path) -> list[dict]:
    path = state_dir / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def main(tool: str, state: str, args: list[str]) -> int:
    state_dir = Path(state)
    with open(state_dir / "calls.jsonl", "a") as log:
        log.write(json.dumps({"tool": tool, "args": args, "at": time.time()}) + "\n")
    return {"sbatch": _sbatch, "squeue": _squeue, "sacct": _sacct, "scancel": _scancel, "srun": _srun,
            "scontrol": _scontrol, "job": _run_job}[tool](state_dir, args)


def _new_job(state_dir: Path) -> tuple[str, Path]:
    number = FIRST_JOB_ID
    while True:  # mkdir is atomic: two submissions never share an id
        try:
            (state_dir / "jobs" / str(number)).mkdir()
            return str(number), state_dir / "jobs" / str(number)
        except FileExistsError:
            number += 1


def _sbatch(state_dir: Path, args: list[str]) -> int:
    script = Path(args[-1])
    nodes = int(re.search(r"^#SBATCH --nodes=(\d+)$", script.read_text(), re.M).group(1))
    output = next((a.split("=", 1)[1] for a in args if a.startswith("--output=")), "slurm.out")
    job_id, job = _new_job(state_dir)
    (job / "queued").touch()
    subprocess.Popen([sys.executable, __file__, "job", str(state_dir), job_id, str(script), output, str(nodes)],
                     start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    print(job_id if "--parsable" in args else f"Submitted batch job {job_id}")
    return 0


def _run_job(state_dir: Path, args: list[str]) -> int:
    """The batch step: the script under bash, then the job's accounting record."""
    job_id, script, output, nodes = args
    job = state_dir / "jobs" / job_id
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env.update(FAKE_SLURM_STATE=str(state_dir), SLURM_JOB_ID=job_id, SLURM_JOB_NUM_NODES=nodes, SLURM_NNODES=nodes,
               SLURM_JOB_NODELIST=",".join(["127.0.0.1"] * int(nodes)))
    with open(output, "ab") as log:
        code = subprocess.call(["bash", script], env=env, stdout=log, stderr=subprocess.STDOUT)
    if (job / "cancelled").exists():
        record = f"CANCELLED by {os.getuid()}|0:{-code if code < 0 else 0}"
    else:
        record = "COMPLETED|0:0" if code == 0 else (f"FAILED|{code}:0" if code > 0 else f"FAILED|0:{-code}")
    (job / "sacct").write_text(record + "\n")
    (job / "queued").unlink()
    return 0


def _squeue(state_dir: Path, args: list[str]) -> int:
    job = state_dir / "jobs" / args[args.index("-j") + 1]
    if not job.exists():
        print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
        return 1
    if (job / "queued").exists():
        print("RUNNING")
    return 0


def _sacct(state_dir: Path, args: list[str]) -> int:
    record = state_dir / "jobs" / args[args.index("-j") + 1] / "sacct"
    if record.exists():
        print(record.read_text().strip())
    return 0


def job_processes(state_dir: Path, job_id: str, *, steps_only: bool) -> list[int]:
    found = []
    marks = (f"SLURM_JOB_ID={job_id}".encode(), f"FAKE_SLURM_STATE={state_dir}".encode())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if all(mark in env for mark in marks) and (not steps_only or any(e.startswith(b"SLURM_STEP_ID=") for e in env)):
            found.append(int(entry.name))
    return found


def _signal(pids: list[int], number: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, number)
        except ProcessLookupError:
            pass


def _scancel(state_dir: Path, args: list[str]) -> int:
    job_id = args[-1]
    job = state_dir / "jobs" / job_id
    if not (job / "queued").exists():
        print(f"scancel: error: Kill job error on job id {job_id}: Job/step already completing or completed",
              file=sys.stderr)
        return 1
    sent = next((a.split("=", 1)[1] for a in args if a.startswith("--signal=")), None)
    if sent is not None:
        _signal(job_processes(state_dir, job_id, steps_only=True), signal.Signals["SIG" + sent])
    else:
        (job / "cancelled").touch()
        _signal(job_processes(state_dir, job_id, steps_only=False), signal.SIGKILL)
    return 0


def _srun(state_dir: Path, args: list[str]) -> int:
    options = args[: next(i for i, a in enumerate(args) if not a.startswith("-"))]
    command = args[len(options):]
    nodes = int(os.environ["SLURM_JOB_NUM_NODES"])
    tasks = [subprocess.Popen(command, start_new_session=True,  # each "node" its own session
                              env={**os.environ, "SLURM_STEP_ID": "0", "SLURM_NODEID": str(node),
                                   "SLURM_PROCID": str(node), "SLURM_LOCALID": "0"})
             for node in range(nodes)]
    with open(state_dir / "jobs" / os.environ["SLURM_JOB_ID"] / "tasks", "a") as record:
        record.write("".join(f"{node} {task.pid}\n" for node, task in enumerate(tasks)))
    while any(t.poll() is None for t in tasks):
        if "--kill-on-bad-exit=1" in options and any(t.poll() not in (None, 0) for t in tasks):
            _signal(job_processes(state_dir, os.environ["SLURM_JOB_ID"], steps_only=True), signal.SIGKILL)
        time.sleep(0.1)
    codes = [t.returncode if t.returncode >= 0 else 128 - t.returncode for t in tasks]
    return max(codes)


def _scontrol(state_dir: Path, args: list[str]) -> int:
    if args[:2] == ["show", "hostnames"]:
        print("\n".join(args[2].split(",")))
        return 0
    return 1


if __name__ == "__main__":  # the background batch step started by sbatch
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
