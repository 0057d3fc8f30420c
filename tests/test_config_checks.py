"""Bad configs stop before any job: every problem named by its key path, in one short message."""
import copy
import shlex
import subprocess
import sys

import pytest
import yaml
from conftest import REPO

from workflow_src.config_checks import ConfigError, check_config, schema_problems

SCHEMA = yaml.safe_load((REPO / "config/schema.yaml").read_text())


def filled(overrides: dict) -> dict:
    """config/config.yaml with `overrides` merged in, validated and filled with the schema's defaults."""
    from snakemake.utils import update_config, validate
    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())
    update_config(cfg, copy.deepcopy(overrides))
    validate(cfg, str(REPO / "config/schema.yaml"), set_default=True)
    return cfg


def problems(overrides: dict) -> list[str]:
    try:
        check_config(filled(overrides), SCHEMA)
    except ConfigError as e:
        return e.problems
    return []


def test_the_default_config_has_no_problem():
    assert problems({}) == []


def test_full_can_be_measured_against_the_reference_reward_service():
    """reward.services.reference is the write-up's server: 8 workers, OpenMP/MKL capped at 4 threads each."""
    from workflow_src.config_schema import defaults
    assert defaults("reward")["services"]["reference"] == {"workers": 8, "threads": 1, "omp_threads": 4}
    against = {"speedup": {"comparisons": {"full_vs_reference": {
        "subject": "rl", "switches": [], "baseline_reward_service": "reference", "optimized_reward_service": "tuned"}}}}
    assert problems(against) == []
    against["speedup"]["comparisons"]["full_vs_reference"]["baseline_reward_service"] = "referenc"
    assert any("'referenc' is not in reward.services" in p for p in problems(against))


@pytest.mark.parametrize("overrides, key", [
    ({"checkpoint": {"name": ".."}}, "checkpoint.name"),
    ({"checkpoint": {"name": "."}}, "checkpoint.name"),
    ({"checkpoint": {"name": "../escape"}}, "checkpoint.name"),
    ({"experiment": ".."}, "experiment"),
    ({"experiment": "a/b"}, "experiment"),
    ({"speedup": {"comparisons": {"..": {"subject": "rl"}}}}, "speedup.comparisons"),
])
def test_names_that_would_leave_results_are_refused(overrides, key):
    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())
    cfg.update(overrides)
    found = schema_problems(cfg, SCHEMA)
    assert found and all(p.startswith(key) for p in found), found


def test_an_unknown_key_is_one_short_line():
    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())
    cfg["speedup"] = {"comparisons": {"full": {"subject": "rl", "baseline_setings": {}}}}
    assert schema_problems(cfg, SCHEMA) == [
        "speedup.comparisons.full: Additional properties are not allowed ('baseline_setings' was unexpected)"]


def test_cross_field_problems_are_named_by_key_path():
    found = problems({
        "randopt": {"population": 16, "ks": [4, 32], "vote": {"headline_k": 5}},
        "evidence": {"engine_bench": {"engines": ["static"], "population_engines": ["hf", "static"]}},
        "speedup": {"windows": 10**4, "window_steps": 10**5,
                    "comparisons": {"full": {"subject": "rl", "baseline_settings": {"group_size": 4, "nosuch": 1,
                                                                                     "threads": 1},
                                             "optimized_settings": {"threads": 2}}}},
    })
    text = "\n".join(found)
    assert "randopt.ks: [32] larger than randopt.population (16)" in text and "randopt.cap_ks" in text
    assert "randopt.vote.headline_k: 5 is not among the sweep's Ks" in text
    assert "more than speedup.max_steps" in text
    assert "speedup.comparisons.full.baseline_settings.nosuch: not an rl setting" in text
    assert "baseline_settings.group_size = 4 but optimized_settings.group_size" in text
    assert "threads" not in text.split("group_size")[0]          # an implementation setting may differ
    assert "evidence.engine_bench.population_engines: hf not among evidence.engine_bench.engines" in text
    assert len(found) == 6
    busy = problems({"speedup": {"comparisons": {"c": {"subject": "rl", "gpu_busy_steps": 2}}}})
    assert busy == ["speedup.comparisons.c.gpu_busy_steps: the GPU's busy share needs rl.device cuda on both sides"]
    hf = problems({"evidence": {"engine_bench": {"engines": ["hf", "static"]}}})
    assert len(hf) == 1 and "evidence.engine_bench.lengths: histogram:config/lengths/gsm8k-like.csv needs" in hf[0]
    several = problems({"evidence": {"engine_bench": {"engines": ["static:compact=0", "static"],
                                                      "seeds_per_step": [1, 2]}}})
    assert several == []
    several = problems({"evidence": {"engine_bench": {"engines": ["vllm", "static"], "seeds_per_step": [2],
                                                      "lengths": None}}})
    assert len(several) == 1 and "seeds_per_step: 2 seeds per step is the static engine's" in several[0]
    compared = problems({"evidence": {"engine_bench": {"seeds": 2, "agreement": 3, "seeds_per_step": [1, 2]}}})
    assert compared == ["evidence.engine_bench.agreement: 3 seeds compared, but the population has 2 "
                        "(evidence.engine_bench.seeds)"]
    # one seed at a time has nothing to compare: no population at all (the hf preset's seeds: 0) is fine
    assert problems({"evidence": {"engine_bench": {"seeds": 0}}}) == []
    # the profile holds decode steps only: one new token is the prefill's alone
    assert problems({"evidence": {"engine_bench": {"profile": 2}}}) == []
    assert "evidence.engine_bench.profile: 1 new token" in problems({"evidence": {"engine_bench": {"profile": 1}}})[0]


def test_comparison_settings_are_checked_against_the_rl_schema():
    found = problems({"speedup": {"comparisons": {"full": {
        "subject": "rl", "baseline_settings": {"threads": "two"}, "optimized_settings": {"threads": 0}}}}})
    assert any(p.startswith("speedup.comparisons.full.baseline_settings.threads: 'two' is not of type")
               for p in found), found
    assert any(p.startswith("speedup.comparisons.full.optimized_settings.threads: 0 is less than") for p in found)


def test_a_capped_k_is_allowed_when_asked_for():
    assert problems({"randopt": {"population": 16, "ks": [4, 32], "cap_ks": True}}) == []


def test_a_dry_run_stops_before_any_job_with_every_problem(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({
        "randopt": {"ks": [4, 8, 16], "vote": {"headline_k": 12}},
        "speedup": {"comparisons": {"full": {"subject": "rl", "optimized_settings": {"max_new_tokens": 3}}}},
        "bitwise": {"reference": "nosuch"},
    }))
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                           str(tmp_path), "--configfile", str(tmp_path / "config.yaml"), "-n", "--cores", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    err = proc.stdout + proc.stderr
    assert "randopt.vote.headline_k: 12" in err and "optimized_settings.max_new_tokens = 3" in err
    assert "bitwise.reference: 'nosuch' is not a run in bitwise.runs" in err
    assert "KeyError" not in err and "Job stats" not in err and not (tmp_path / "results").exists()


RANDOM = {"checkpoint": {"source": "random", "random": {"architecture": "qwen2.5-0.5b"}},
          "randopt": {"engine": "static", "max_new_tokens": 512}}


def test_length_models_are_checked_before_any_job(tmp_path):
    empty, long = tmp_path / "empty.csv", tmp_path / "long.csv"
    empty.write_text("tokens,count\n")
    long.write_text("tokens,count\n100,1\n600,2\n")
    gsm8k = f"histogram:{REPO / 'config/lengths/gsm8k-like.csv'}"
    assert problems({**RANDOM, "randopt": {**RANDOM["randopt"], "lengths": gsm8k}}) == []
    for lengths, says in ((f"histogram:{empty}", "at least one row"), (f"histogram:{long}", "more than max_new_tokens"),
                          (f"histogram:{tmp_path / 'absent.csv'}", "cannot read")):
        [problem] = problems({**RANDOM, "randopt": {**RANDOM["randopt"], "lengths": lengths}})
        assert problem.startswith("randopt.lengths") and says in problem
    [problem] = problems({"randopt": {"engine": "static", "lengths": "fixed:8"}})
    assert "random weights" in problem and "'synthetic'" in problem


@pytest.mark.parametrize("preset, train, test, tokens, chunk", [
    ("randopt-flashopt-7b-gsm8k.yaml", 128, 256, 512, 2046),
    ("randopt-flashopt-7b-math500-hard.yaml", 64, 192, 2048, 2048),
])
def test_flashopt_presets_set_the_speedruns_settings(preset, train, test, tokens, chunk):
    """The speedrun's numbers at cc396cd (configs/run_512_7b_*.yaml, speedrun.py, eval/fineweb.py) where a
    setting can match them: K = int(r·N) for r in top_k_ratios [0.02, 0.05], the vote over raw strings, bpb
    chunks of max_len (clamped to max_model_len − 2) with each first token unscored, 256 chunks, one engine."""
    from workflow_src.randopt.select import resolve_ks
    cfg = filled(yaml.safe_load((REPO / "config/presets" / preset).read_text()))
    check_config(cfg, SCHEMA)
    r = cfg["randopt"]
    ratios, n = [0.02, 0.05], 512
    assert r["population"] == n and r["seed"] == 42 and r["sigmas"] == [0.0005, 0.001, 0.002]
    assert resolve_ks(n, r["ks"], r["k_ratios"], r["k_ratio_rounding"]) == sorted({max(1, int(x * n)) for x in ratios})
    assert r["vote"]["grouping"] == "exact_string" and r["vote"]["headline_k"] == 25 and r["bpb"]["k"] == 25
    assert r["bpb"] == {**r["bpb"], "chunk_start": "unscored", "max_chunks": 256, "chunk_tokens": chunk}
    assert (r["train_prompts"], r["test_prompts"], r["max_new_tokens"], r["shards"], r["probes"]) == (train, test, tokens, 1, 5)
    assert cfg["task"]["prompt_format"] == "chat"
    if cfg["task"]["name"] == "math500":
        m = cfg["task"]["math500"]
        assert (m["levels"], m["split"], m["n_test"], m["n_train"], m["split_seed"]) == ([4, 5], "flashopt", 192, 64, 42)
        assert m["prompt_template"] == "{problem}\n\nLet's think step by step and output the final answer after ####"
def _unbounded(node: dict, path: str, found: list[str]) -> None:
    """Sizes of the schema without an upper bound: integers (seeds and token ids are values, not sizes), arrays,
    and maps whose keys are the user's."""
    types = node.get("type") if isinstance(node.get("type"), list) else [node.get("type")]
    leaf = path.rsplit(".", 1)[-1].removesuffix("[]")
    if "integer" in types and "maximum" not in node and "enum" not in node and not leaf.endswith("seed") \
            and leaf != "tokens":
        found.append(path)
    if "array" in types and "maxItems" not in node:
        found.append(path)
    if isinstance(node.get("additionalProperties"), dict) and "maxProperties" not in node:
        found.append(path)
    for key, sub in node.get("properties", {}).items():
        _unbounded(sub, f"{path}.{key}".lstrip("."), found)
    for key in ("additionalProperties", "items"):
        if isinstance(node.get(key), dict):
            _unbounded(node[key], path + (".*" if key == "additionalProperties" else "[]"), found)
    for branch in node.get("oneOf", []) + node.get("anyOf", []):
        _unbounded(branch, path, found)
    for key, sub in node.get("$defs", {}).items():
        _unbounded(sub, f"$defs.{key}", found)


def test_every_size_in_the_schema_is_bounded():
    found = []
    _unbounded(SCHEMA, "", found)
    assert found == []


@pytest.mark.parametrize("overrides, key", [
    ({"speedup": {"repeats": 10**12}}, "speedup.repeats"),
    ({"randopt": {"population": 2**32 + 1}}, "randopt.population"),
    ({"bitwise": {"steps": 10**12}}, "bitwise.steps"),
    ({"checkpoint": {"synthetic": {"pretrain": {"steps_max": 10**12}}}}, "checkpoint.synthetic.pretrain.steps_max"),
    ({"speedup": {"comparisons": {f"c{i}": {"subject": "rl"} for i in range(65)}}}, "speedup.comparisons"),
])
def test_a_size_past_its_limit_is_refused_naming_the_key(overrides, key):
    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())
    for section, value in overrides.items():
        cfg[section] = {**cfg.get(section, {}), **value} if isinstance(value, dict) else value
    found = schema_problems(cfg, SCHEMA)
    assert len(found) == 1 and found[0].startswith(f"{key}: ") and "than the maximum of" in found[0], found


def test_the_plan_never_grows_with_an_unchecked_size(tmp_path):
    """speedup.repeats 10**12 (3 × repeats launch names) is refused before anything is planned: at once, in
    little memory (the process may not take 4 GiB of address space), naming the key."""
    import resource

    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())
    cfg["speedup"] = {**cfg.get("speedup", {}), "repeats": 10**12}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                           str(tmp_path), "--configfile", str(tmp_path / "config.yaml"), "-n", "--cores", "1"],
                          capture_output=True, text=True, timeout=120, preexec_fn=limit_memory)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "speedup.repeats: 1000000000000 is greater than the maximum of 100" in proc.stdout + proc.stderr


def test_a_population_beyond_the_seed_space_is_refused():
    from workflow_src.noise.speedproof import population_seeds
    with pytest.raises(ValueError, match="2\\*\\*32 distinct seeds"):
        population_seeds(0, 2**32 + 1)


HOSTILE = "lean_decode x; touch /tmp/PWNED #"


@pytest.mark.parametrize("section, value, key", [
    ("bitwise", {"runs": {"baseline": {"impl": "baseline"}, "x": {"impl": "optimized", "switches": [HOSTILE]}}},
     "bitwise.runs.x.switches.0"),
    ("bitwise", {"switch_check": {"candidates": [HOSTILE]}}, "bitwise.switch_check.candidates.0"),
    ("bitwise", {"reference": "a b"}, "bitwise.reference"),
    ("speedup", {"comparisons": {"c": {"subject": "rl", "switches": [HOSTILE]}}}, "speedup.comparisons.c.switches.0"),
    ("rl", {"switches": [HOSTILE]}, "rl.switches.0"),
])
def test_names_that_reach_a_shell_line_are_held_to_a_pattern(section, value, key):
    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())
    cfg[section] = {**cfg.get(section, {}), **value}
    found = schema_problems(cfg, SCHEMA)
    assert found and any(p.startswith(f"{key}: ") for p in found), found


@pytest.mark.parametrize("key, mapping", [("speedup", "comparisons"), ("bitwise", "runs"), ("reward", "services")])
def test_user_chosen_names_are_held_to_a_pattern(key, mapping):
    node = SCHEMA["properties"][key]["properties"][mapping]
    assert node["propertyNames"]["pattern"].endswith("[A-Za-z0-9_]+$")


def test_every_shell_line_of_the_plan_is_quoted_words(tmp_path):
    """Each job's shell line splits into words, and the bitwise run's subject command keeps its switches one word."""
    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                           str(tmp_path), "--configfile", str(tmp_path / "config.yaml"), "-n", "-p", "--cores", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    commands = [line.removeprefix("Shell command: ") for line in proc.stdout.splitlines()
                if line.startswith("Shell command: ")]
    assert len(commands) > 20
    for command in commands:
        shlex.split(command)  # raises on an unbalanced quote
    control = next(shlex.split(c) for c in commands if "deterministic_run --run control " in c)
    inner = shlex.split(control[control.index("--command") + 1])
    assert inner[inner.index("--switches") + 1] == "control_reduction_order"
