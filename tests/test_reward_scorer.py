"""The model-scored reward (reward.kind model): the scorer's score of a completion is the same whatever else
its request holds and wherever in a request it sits; the service of that kind answers what the scorer computes
under other worker settings; and what the scorer cannot read, or a service that cannot load it, stops a
launch before step 0."""
import subprocess
import sys

import pytest
import requests
from conftest import REPO, write_section

from workflow_src.config_schema import resolve
from workflow_src.subjects.reward.client import RewardClient
from workflow_src.subjects.reward.scorer import Scorer, ScorerError, combine
from workflow_src.subjects.reward.service import RewardService, RewardServiceStartError
from workflow_src.subjects.rl.rewards import InProcessRewards

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "vocab_size": 512, "max_position_embeddings": 64}


def spec(**overrides):
    return resolve("reward", {"kind": "model", "scorer": {"overrides": TINY, "rows": 4, "context": 16,
                                                          "weight": 0.5, **overrides}})["scorer"]


@pytest.fixture(scope="module")
def scorer():
    return Scorer(spec())


IDS = [[5, 6, 7], [9], [], [100, 200, 300, 400, 500, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [3, 3, 3, 3, 3]]


def test_a_score_depends_on_its_completion_alone(scorer):
    scores = scorer.score(IDS)
    assert len(scores) == len(IDS) and all(0.0 < x < 1.0 for x in scores) and len(set(scores)) == len(IDS)
    # alone, in another order (other chunk and row), beside other companions: the same bits
    assert [scorer.score([ids])[0] for ids in IDS] == scores
    assert scorer.score(IDS[::-1]) == scores[::-1]
    assert scorer.score([[1, 2], IDS[0], [7] * 9])[1] == scores[0]
    # a scorer of other weights scores otherwise (the comparison can fail)
    assert Scorer(spec(seed=1)).score(IDS) != scores
    with pytest.raises(ScorerError, match="17 tokens; the scorer's context is 16"):
        scorer.score([[1] * 17])
    with pytest.raises(ScorerError, match="token id 512 outside the scorer's vocabulary"):
        scorer.score([[1, 512]])
    assert combine([1.0, 0.0], [0.5, 0.25], 0.5) == [1.25, 0.125]


COMPLETIONS = ["#### 7", "#### 8", "x", "#### 70", "y"]
ANSWERS = ["7", "7", "1", "70", "2"]


@pytest.fixture(scope="module")
def model_service():
    with RewardService(workers=2, threads=2, startup_timeout_s=60, scorer=spec()) as svc:
        yield svc


def test_the_model_kind_service_scores_as_the_scorer_under_any_worker_settings(scorer, model_service):
    """Against the in-process scorer: other processes, threads and request batches, the same rewards."""
    grades = InProcessRewards(overlap=False).score(COMPLETIONS, ANSWERS)
    want = combine(grades, scorer.score(IDS), 0.5)
    with RewardClient(model_service.url, max_batch=2) as client:  # requests of 2, 2 and 1 completions
        health = client.health()
        assert health["kind"] == "model" and health["scorer"]["context"] == 16
        detail = client.score_detail(COMPLETIONS, ANSWERS, IDS)
        assert detail["rewards"] == want and detail["model"] == scorer.score(IDS)
    r = requests.post(f"{model_service.url}/score", timeout=10, json={"id": "a", "task": "synthetic_arithmetic",
                                                                       "completions": ["x"], "answers": ["1"]})
    assert r.status_code == 400 and "send completion_ids" in r.json()["error"]
    r = requests.post(f"{model_service.url}/score", timeout=10, json={
        "id": "b", "task": "synthetic_arithmetic", "completions": ["x"], "answers": ["1"],
        "completion_ids": [[1] * 17]})
    assert r.status_code == 400 and "context is 16" in r.json()["error"]


def test_the_trainer_sends_its_completions_ids_to_the_scorer(rl_subject_checkpoint, model_service):
    """A step's rewards from the model kind are the in-process grades plus 0.5 × a score in (0, 1) each."""
    import struct

    from test_rl_subject import RL, TASK

    from workflow_src.subjects.rl.settings import RLSettings
    from workflow_src.subjects.rl.trainer import Trainer

    def rewards(client):
        t = Trainer(rl_subject_checkpoint, RLSettings.from_dict(RL), TASK, frozenset({"lean_decode"}), rewards=client)
        try:
            return [struct.unpack(">f", bytes.fromhex(h))[0] for h in t.step(0)["samples"]["rewards"]]
        finally:
            t.close()

    client = RewardClient(model_service.url, overlap=False)
    client.service = client.health()
    graded, scored = rewards(None), rewards(client)
    assert len(graded) == len(scored) and all(0.0 < s - g < 0.5 for g, s in zip(graded, scored))


def test_a_service_that_cannot_load_its_scorer_never_becomes_healthy():
    pytest.importorskip("torch")
    import torch
    if torch.cuda.is_available():
        pytest.skip("needs a machine without a GPU")
    with pytest.raises(RewardServiceStartError, match="sees no GPU"):
        RewardService(workers=1, threads=1, startup_timeout_s=60, scorer=spec(device="cuda")).start()


def test_a_launch_whose_completions_the_scorer_cannot_read_fails_before_step_0(rl_subject_checkpoint, tmp_path):
    from test_rl_subject import RL, TASK
    rl = write_section(tmp_path / "rl.json", "rl", RL)
    task = write_section(tmp_path / "task.json", "task.synthetic_arithmetic", TASK)
    from workflow_src.subjects.rl.settings import SettingsError
    from workflow_src.subjects.rl.trainer import check_scorer_fits
    with pytest.raises(SettingsError, match="vocabulary of 8 ids; the policy's tokenizer has 40"):
        check_scorer_fits({"scorer": {"architecture": "a", "vocab_size": 8, "context": 32}}, 40, 14)
    check_scorer_fits({"kind": "grade"}, 40, 14)
    reward = write_section(tmp_path / "reward.json", "reward", {"kind": "model", "service": "one",
                           "services": {"one": {"workers": 1, "threads": 1}},
                           "scorer": {"overrides": TINY, "rows": 4, "context": RL["max_new_tokens"] - 1}})
    out = tmp_path / "short"
    proc = subprocess.run([sys.executable, "-m", "workflow_src.subjects.reward.serve", "--reward-section", str(reward),
                           "--service", "one", "--", sys.executable, "-m", "workflow_src.subjects.rl", "--impl",
                           "baseline", "--checkpoint", str(rl_subject_checkpoint), "--rl-section", str(rl),
                           "--task-section", str(task), "--reward-section", str(reward), "--steps", "1",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0 and "reward.scorer.context" in proc.stderr and "nothing was recorded" in proc.stderr
    assert not (out / "steps.jsonl").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_a_gpu_scorer_answers_the_same_bits_with_requests_in_flight_together():
    """The realistic preset's scorer (0.5B shape, bf16, 16 rows × 128 tokens) in 2 workers × 2 threads: requests
    sent one at a time and the same requests sent 4 at a time get the same rewards, and a scorer of other
    weights does not (the comparison can fail)."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    rng = random.Random(0)
    chunks = [[[rng.randrange(151_000) for _ in range(128)] for _ in range(16)] for _ in range(8)]

    def scorer_spec(seed=0):
        return resolve("reward", {"kind": "model", "scorer": {"architecture": "qwen2.5-0.5b", "dtype": "bfloat16",
                                                              "device": "cuda", "seed": seed}})["scorer"]

    def detail(client, ids):
        return client.score_detail(["x"] * len(ids), ["1"] * len(ids), ids)["model"]

    with RewardService(workers=2, threads=2, startup_timeout_s=120, scorer=scorer_spec()) as svc:
        with RewardClient(svc.url) as client:
            one_at_a_time = [detail(client, ids) for ids in chunks]
        with RewardClient(svc.url) as client, ThreadPoolExecutor(4) as pool:
            for _ in range(3):
                assert list(pool.map(lambda ids: detail(client, ids), chunks)) == one_at_a_time
    with RewardService(workers=1, threads=1, startup_timeout_s=120, scorer=scorer_spec(seed=1)) as other:
        with RewardClient(other.url) as client:
            assert detail(client, chunks[0]) != one_at_a_time[0]
