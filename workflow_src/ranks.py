"""Start a Python subject on every rank: one process, torchrun on one host, or torchrun on each node.

    python -m workflow_src.ranks --nnodes N --nproc-per-node P [--local-nodes] -- -m MODULE ARGS...

What follows `--` is what would follow `python` (`-m module ...` or `script.py ...`).
- N = 1, P = 1: the subject itself, one process (no torch.distributed).
- N = 1, P > 1: `torchrun --standalone` with P ranks on this host.
- N > 1 inside a SLURM allocation (the launch job asked for N nodes): `srun` starts this CLI once per
  node, and each node runs torchrun with `--node-rank $SLURM_NODEID` against the allocation's first host.
- N > 1 with `--local-nodes`: N torchruns on this host, node ranks 0..N-1 (a rehearsal of the multi-node
  path, used by the tests with gloo on the CPU).

A node service (the RL subject's reward service, workflow_src/subjects/reward/serve.py) binds loopback on the
host that started it, so every node other than node 0 starts an equal one of its own around its torchrun.
The service announces how in NODE_SERVICE_VARIABLE: JSON {"args": what follows `python` to start it,
"record": its record or null}; the node's copy gets `--record <record>.node<r>` and runs the torchrun after
`--`. Rewards are a function of the texts, so which instance grades does not matter.

The rendezvous is static (`--node-rank`, `--master-addr`): global rank = node rank × P + local rank, so
which node answers first never changes a rank's prompts, seeds or records, and two launches of the
same world lay their ranks out the same way (the bitwise comparison matches rank r with rank r).
The exit status is the subject's (the first failing node's, with --local-nodes).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
NODE_SERVICE_VARIABLE = "SPEEDPROOF_NODE_SERVICE"


class RanksError(ValueError):
    pass


def torchrun_command(subject: list[str], nnodes: int, nproc: int, node_rank: int, master_addr: str,
                     port: int) -> list[str]:
    if nnodes == 1:
        return [*TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", *subject]
    return [*TORCHRUN, f"--nnodes={nnodes}", f"--nproc-per-node={nproc}", f"--node-rank={node_rank}",
            f"--master-addr={master_addr}", f"--master-port={port}", *subject]


def slurm_head_node(nodelist: str) -> str:
    """The allocation's first host (SLURM's compressed node list, expanded by scontrol)."""
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    hosts = out.stdout.split()
    if not hosts:
        raise RanksError(f"scontrol show hostnames {nodelist!r} named no host")
    return hosts[0]


def slurm_port(job_id: str) -> int:
    """A port every node of one allocation agrees on without talking, different between jobs."""
    return 20000 + int(job_id) % 20000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def with_node_service(command: list[str], node_rank: int, env: dict[str, str]) -> list[str]:
    """Node 0 shares the host of the launch's node service; another node starts a service of its own."""
    if node_rank == 0 or NODE_SERVICE_VARIABLE not in env:
        return command
    spec = json.loads(env[NODE_SERVICE_VARIABLE])
    record = spec.get("record")
    if record:
        stem, dot, ext = record.rpartition(".")
        record = f"{stem}.node{node_rank}.{ext}" if dot else f"{record}.node{node_rank}"
    return [sys.executable, *spec["args"], *(["--record", record] if record else []), "--", *command]


def plan(subject: list[str], nnodes: int, nproc: int, local_nodes: bool, env: dict[str, str],
         node_rank: int | None = None, master_addr: str | None = None, port: int | None = None) -> list[list[str]]:
    """The command(s) to run here: one command, or one per simulated node with --local-nodes."""
    if nnodes < 1 or nproc < 1:
        raise RanksError(f"--nnodes and --nproc-per-node must be >= 1, got {nnodes} and {nproc}")
    if not subject:
        raise RanksError("no subject: give what follows `python` after `--`, e.g. -- -m workflow_src.subjects.rl ...")
    if nnodes == 1 and nproc == 1:
        return [[sys.executable, *subject]]
    if nnodes == 1:
        return [torchrun_command(subject, 1, nproc, 0, "", 0)]
    if node_rank is not None:  # one node's share, started by srun (below)
        return [with_node_service(torchrun_command(subject, nnodes, nproc, node_rank, master_addr or "",
                                                          port or 0), node_rank, env)]
    if local_nodes:
        port = free_port()
        return [with_node_service(torchrun_command(subject, nnodes, nproc, r, "127.0.0.1", port), r, env)
                for r in range(nnodes)]
    if "SLURM_JOB_ID" not in env:
        raise RanksError(f"{nnodes} nodes need a SLURM allocation of {nnodes} nodes (run through "
                         "profiles/slurm, where the launch rules request them); on one host use nnodes 1")
    allocated = int(env.get("SLURM_JOB_NUM_NODES", env.get("SLURM_NNODES", "1")))
    if allocated < nnodes:
        raise RanksError(f"the SLURM allocation has {allocated} node(s); this launch needs {nnodes}")
    head = slurm_head_node(env["SLURM_JOB_NODELIST"])
    port = slurm_port(env["SLURM_JOB_ID"])
    per_node = [sys.executable, "-m", "workflow_src.ranks", f"--nnodes={nnodes}",
                f"--nproc-per-node={nproc}", "--node-rank-from-slurm", f"--master-addr={head}", f"--port={port}",
                "--", *subject]
    return [["srun", f"--nodes={nnodes}", f"--ntasks={nnodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
             *per_node]]


def run(commands: list[list[str]], poll_s: float = 0.2) -> int:
    """Run the commands side by side; when one fails, the others are stopped (they would wait at the
    rendezvous for a node that is gone) and its status is returned."""
    if len(commands) == 1:
        return subprocess.call(commands[0])
    procs = [subprocess.Popen(c) for c in commands]
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                return failed[0]
            if all(c == 0 for c in codes):
                return 0
            time.sleep(poll_s)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            p.wait()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        sys.exit("ranks: put the subject after `--`, e.g. -- -m workflow_src.subjects.rl ...")
    cut = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--nproc-per-node", type=int, default=1)
    parser.add_argument("--local-nodes", action="store_true", help="simulate the nodes on this host")
    parser.add_argument("--node-rank-from-slurm", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--master-addr", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv[:cut])
    node_rank = int(os.environ["SLURM_NODEID"]) if args.node_rank_from_slurm else None
    try:
        commands = plan(argv[cut + 1:], args.nnodes, args.nproc_per_node, args.local_nodes, dict(os.environ),
                        node_rank, args.master_addr, args.port)
    except (RanksError, subprocess.CalledProcessError) as e:
        sys.exit(f"ranks: {e}")
    sys.exit(run(commands))


if __name__ == "__main__":
    main()
