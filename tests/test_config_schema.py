"""config/schema.yaml: the embedded default validates; each class of bad config is refused, naming the key."""
import copy
import subprocess
import sys

import pytest
import yaml
from conftest import REPO
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

SCHEMA = str(REPO / "config/schema.yaml")


def default_config():
    return yaml.safe_load((REPO / "config/config.yaml").read_text())


def refused(cfg) -> str:
    with pytest.raises(WorkflowError) as e:
        validate(cfg, SCHEMA)
    return str(e.value) + " " + " ".join(str(a) for a in e.value.args)


def test_default_config_validates_and_gets_every_default():
    cfg = default_config()
    validate(cfg, SCHEMA)
    assert cfg["checkpoint"]["source"] == "synthetic"
    assert cfg["environment"]["on_pin_mismatch"] == "warn"
    assert cfg["checkpoint"]["synthetic"]["pretrain"]["accuracy_band"]["low"] < \
        cfg["checkpoint"]["synthetic"]["pretrain"]["accuracy_band"]["high"]
    assert cfg["task"]["synthetic_arithmetic"]["n_test"] > 0


def test_empty_config_is_the_default():
    cfg = {}
    validate(cfg, SCHEMA)
    full = default_config()
    validate(full, SCHEMA)
    assert cfg == full


def _schema_nodes(node, path="$"):
    if isinstance(node, dict):
        yield path, node
        for k, v in node.items():
            if k in ("if", "then", "else"):  # constraints on keys described elsewhere
                continue
            yield from _schema_nodes(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _schema_nodes(v, f"{path}[{i}]")


def test_every_property_is_described():
    schema = yaml.safe_load((REPO / "config/schema.yaml").read_text())
    missing = []
    for path, node in _schema_nodes(schema):
        for name, sub in (node.get("properties") or {}).items():
            if isinstance(sub, dict) and "description" not in sub and "$ref" not in sub:
                missing.append(f"{path}.{name}")
    assert not missing, missing


@pytest.mark.parametrize("mutate, key", [
    (lambda c: c.update(bogus=1), "bogus"),
    (lambda c: c["checkpoint"].update(sorce="hf"), "sorce"),
    (lambda c: c["environment"].update(on_pin_mismatch="maybe"), "on_pin_mismatch"),
    (lambda c: c["checkpoint"]["synthetic"].update(hidden_size="big"), "hidden_size"),
    (lambda c: c["checkpoint"].update(source="hf", hf={"repo_id": "Qwen/Qwen2.5-0.5B"}), "revision"),
    (lambda c: c["checkpoint"].update(source="hf", hf={"repo_id": "a/b", "revision": "main"}), "revision"),
    (lambda c: c["checkpoint"].update(source="local"), "path"),
    (lambda c: c["task"]["synthetic_arithmetic"].update(n_test=-3), "n_test"),
])
def test_bad_config_is_refused_naming_the_key(mutate, key):
    cfg = default_config()
    validate(cfg, SCHEMA)  # fill defaults first so nested sections exist
    cfg = copy.deepcopy(cfg)
    mutate(cfg)
    assert key in refused(cfg)


def test_snakemake_stops_before_any_job(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("checkpoint:\n  source: hf\n  hf: {repo_id: a/b, revision: main}\n")
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "-s", str(REPO / "Snakefile"),
                           "--directory", str(tmp_path), "--configfile", str(bad)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "revision" in out and "main" in out
    assert "Job stats" not in out and not (tmp_path / "results").exists()


def test_section_defaults_are_what_snakemake_fills():
    """A CLI handed one section fills the defaults Snakemake's validation fills in the whole config."""
    from snakemake.utils import validate

    from workflow_src import config_schema

    config = {}
    validate(config, str(REPO / "config/schema.yaml"), set_default=True)
    for section in config_schema.schema()["properties"]:
        if isinstance(config[section], dict):
            assert config_schema.defaults(section) == config[section], section
    assert config_schema.defaults("task.gsm8k") == config["task"]["gsm8k"]
    assert config_schema.defaults("checkpoint.synthetic") == config["checkpoint"]["synthetic"]


def test_resolve_names_every_bad_key_and_leaves_its_input_alone():
    from workflow_src.config_schema import ConfigError, resolve

    value = {"population": 0, "populaton": 3, "perturb": {"include": "*"}}
    with pytest.raises(ConfigError) as caught:
        resolve("randopt", value)
    text = str(caught.value)
    for where in ("randopt.population", "'populaton' was unexpected", "randopt.perturb.include"):
        assert where in text
    assert value == {"population": 0, "populaton": 3, "perturb": {"include": "*"}}
    partial = {"perturb": {"exclude": ["lm_head.*"]}}
    filled = resolve("randopt", partial)
    assert filled["perturb"] == {"include": ["*"], "exclude": ["lm_head.*"], "backend": "auto"}
    assert partial == {"perturb": {"exclude": ["lm_head.*"]}}
    with pytest.raises(KeyError, match="no section"):
        resolve("randop", {})


def test_no_module_restates_a_config_default():
    """config/schema.yaml is the one source of defaults: no DEFAULTS dict of config values in the package."""
    import re
    hits = [f"{p.relative_to(REPO)}:{n}" for p in (REPO / "workflow_src").rglob("*.py")
            for n, line in enumerate(p.read_text().splitlines(), 1) if re.match(r"\s*DEFAULTS\s*[:=]", line)]
    assert not hits


@pytest.mark.parametrize("preset", sorted(p.name for p in (REPO / "config" / "presets").glob("*.yaml")))
def test_preset_switch_sets_are_valid_combinations(preset):
    """Every switch set a preset runs parses (needs, conflicts): on the GPU a control that combined
    batched_train with control_reduction_order failed only after the 14-step baseline had run."""
    from workflow_src.subjects.rl.settings import parse_switches
    cfg = yaml.safe_load((REPO / "config" / "presets" / preset).read_text())
    rl_switches = cfg.get("rl", {}).get("switches", [])  # the RandOpt presets leave the RL subject as it is
    parse_switches(rl_switches)
    for name, run in cfg.get("bitwise", {}).get("runs", {}).items():
        if run.get("impl") == "optimized":
            parse_switches(run.get("switches", rl_switches))


# JSON Schema keywords config/schema.yaml may use; anything else in a schema object is a typo or a YAML slip
# (an unquoted comma in a flow mapping cuts a description short and turns its tail into a key).
KEYWORDS = {"$schema", "$id", "$ref", "$defs", "title", "description", "type", "default", "enum", "const",
            "properties", "additionalProperties", "patternProperties", "required", "items", "minItems", "maxItems",
            "uniqueItems", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
            "pattern", "format", "oneOf", "anyOf", "allOf", "not", "if", "then", "else", "propertyNames",
            "minProperties", "maxProperties", "examples"}


def _unknown_keywords(schema, path="$"):
    if not isinstance(schema, dict):
        return
    yield from (f"{path}: {k!r}" for k in schema if k not in KEYWORDS)
    for key in ("properties", "$defs", "patternProperties"):
        for name, sub in (schema.get(key) or {}).items():
            yield from _unknown_keywords(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties", "not", "if", "then", "else", "propertyNames"):
        yield from _unknown_keywords(schema.get(key), f"{path}.{key}")
    for key in ("oneOf", "anyOf", "allOf"):
        for i, sub in enumerate(schema.get(key) or []):
            yield from _unknown_keywords(sub, f"{path}.{key}[{i}]")


def test_schema_objects_use_only_json_schema_keywords():
    schema = yaml.safe_load((REPO / "config/schema.yaml").read_text())
    assert not list(_unknown_keywords(schema))
    # the check itself: a description with an unquoted comma in a flow mapping is caught
    slip = yaml.safe_load("a: {type: integer, description: Prompts per batch (changes numerics, so identity).}")
    assert list(_unknown_keywords({"properties": slip})) == ["$.a: 'so identity).'"]
