"""The ranks CLI's launch plans (workflow_src/ranks.py); the runs themselves are in test_rl_subject."""

import sys

import pytest

from workflow_src import ranks
from workflow_src.ranks import RanksError, plan

SUBJECT = ["-m", "workflow_src.subjects.rl", "--steps", "2"]


def test_one_rank_runs_the_subject_itself():
    assert plan(SUBJECT, 1, 1, False, {}) == [[sys.executable, *SUBJECT]]


def test_one_node_uses_standalone_torchrun():
    (cmd,) = plan(SUBJECT, 1, 4, False, {})
    assert cmd[:3] == ranks.TORCHRUN and "--standalone" in cmd and "--nproc-per-node=4" in cmd
    assert cmd[-len(SUBJECT):] == SUBJECT


def test_local_nodes_get_ranks_in_order_and_one_port():
    cmds = plan(SUBJECT, 3, 2, True, {})
    assert [c[c.index("--nnodes=3") + 2] for c in cmds] == ["--node-rank=0", "--node-rank=1", "--node-rank=2"]
    assert len({c[c.index("--master-addr=127.0.0.1") + 1] for c in cmds}) == 1  # one rendezvous port


def test_slurm_allocation_runs_one_task_per_node(monkeypatch):
    monkeypatch.setattr(ranks, "slurm_head_node", lambda nodelist: {"gpu[3-4]": "gpu3"}[nodelist])
    env = {"SLURM_JOB_ID": "123", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "gpu[3-4]"}
    (cmd,) = plan(SUBJECT, 2, 8, False, env)
    assert cmd[:5] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    assert "--master-addr=gpu3" in cmd and "--port=20123" in cmd and "--node-rank-from-slurm" in cmd
    # what each node's task then runs
    (node,) = plan(SUBJECT, 2, 8, False, env, node_rank=1, master_addr="gpu3", port=20123)
    assert "--node-rank=1" in node and "--master-addr=gpu3" in node and "--master-port=20123" in node


@pytest.mark.parametrize("args, env, message", [
    ((SUBJECT, 2, 1, False), {}, "need a SLURM allocation"),
    ((SUBJECT, 2, 1, False), {"SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "n1"},
     "has 1 node"),
    (([], 1, 2, False), {}, "no subject"),
    ((SUBJECT, 0, 1, False), {}, ">= 1"),
])
def test_bad_plans_are_refused(args, env, message):
    with pytest.raises(RanksError, match=message):
        plan(*args, env)


def test_cli_needs_the_separator(capsys):
    with pytest.raises(SystemExit, match="after `--`"):
        ranks.main(["--nnodes", "2", "-m", "workflow_src.subjects.rl"])


def test_slurm_profile_plans_multi_node_launches(tmp_path):
    """rl.nnodes = 2: every RL launch asks SLURM for 2 nodes and starts through the ranks CLI."""
    import subprocess
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    (tmp_path / "nodes.yaml").write_text("rl: {nnodes: 2, nproc: 4}\n")
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(repo / "Snakefile"), "--directory",
                           str(tmp_path), "--configfile", str(repo / "config/config.yaml"), str(tmp_path / "nodes.yaml"),
                           "--workflow-profile", str(repo / "profiles/slurm"), "-n", "-p"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    launches = [block for block in out.split("\n\n") if "rule speedup_launch:" in block or "rule deterministic_run:" in block]
    assert launches
    for block in launches:
        assert "nodes=2" in block, block
        if "rule deterministic_run:" in block:
            assert "workflow_src.ranks --nnodes 2 --nproc-per-node 4 -- -m workflow_src.subjects.rl" in block, block
    assert any("--ranks 8" in block for block in launches if "rule speedup_launch:" in block)


def test_nodes_past_the_first_start_their_own_reward_service():
    import json

    from workflow_src.subjects.reward.serve import serve_args
    spec = {"args": serve_args("/r/reward.json", "tuned", None, "/r/reward_environment.json"),
            "record": "/out/reward_service.json"}
    env = {ranks.NODE_SERVICE_VARIABLE: json.dumps(spec)}
    first, second = plan(SUBJECT, 2, 1, True, env)
    assert first[:3] == ranks.TORCHRUN  # node 0 shares the launch's service
    assert second[:3] == [sys.executable, "-m", "workflow_src.subjects.reward.serve"]
    cut = second.index("--")
    assert second[3:cut] == ["--reward-section", "/r/reward.json", "--service", "tuned", "--python-from",
                             "/r/reward_environment.json", "--record", "/out/reward_service.node1.json"]
    assert second[cut + 1:cut + 4] == ranks.TORCHRUN and "--node-rank=1" in second
    assert plan(SUBJECT, 2, 1, True, {})[1][:3] == ranks.TORCHRUN  # no service, nothing to start


def test_a_failing_node_stops_the_others():
    import time
    t0 = time.monotonic()
    code = ranks.run([[sys.executable, "-c", "import sys; sys.exit(3)"],
                      [sys.executable, "-c", "import time; time.sleep(60)"]], poll_s=0.05)
    assert code == 3 and time.monotonic() - t0 < 30
    assert ranks.run([[sys.executable, "-c", "pass"], [sys.executable, "-c", "pass"]], poll_s=0.05) == 0
