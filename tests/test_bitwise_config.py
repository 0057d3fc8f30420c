"""config_checks.bitwise_problems: the cross-field checks of the bitwise section, before any job."""
import copy

import pytest
import yaml
from conftest import REPO

from workflow_src.config_checks import ConfigError, bitwise_problems, check_config
from workflow_src.config_schema import resolve

TRAINER = "python tests/data/subjects/tiny_trainer.py"
EXTERNAL = {
    "speedup": {"comparisons": {}, "external": {"baseline": f"{TRAINER} --impl baseline",
                                                "optimized": f"{TRAINER} --impl optimized"}},
    "bitwise": {"steps": 3, "reference": "baseline", "runs": {
        "baseline": {"subject": "external", "impl": "baseline"},
        "optimized": {"subject": "external", "impl": "optimized"},
        "control": {"subject": "external", "impl": "optimized", "command": f"{TRAINER} --impl control",
                    "expect": "fail"}}},
}
RL = {"speedup": {"comparisons": {}, "external": {}},
      "bitwise": {"steps": 14, "reference": "baseline", "runs": {
          "baseline": {"impl": "baseline"}, "optimized": {"impl": "optimized"},
          "control": {"impl": "optimized", "switches": ["control_reduction_order"], "expect": "fail"}}}}


def problems(config):
    """bitwise_problems on the two sections as the Snakefile hands them over: schema defaults filled in."""
    return bitwise_problems({section: resolve(section, config[section]) for section in ("speedup", "bitwise")})


def changed(config, edit):
    config = copy.deepcopy(config)
    edit(config)
    return config


def test_good_configs_have_no_problems():
    assert problems(EXTERNAL) == []
    assert problems(RL) == []


def test_reference_must_be_a_run():
    cfg = changed(EXTERNAL, lambda c: c["bitwise"].update(reference="base"))
    assert problems(cfg) == ["bitwise.reference: 'base' is not a run in bitwise.runs (known: baseline, "
                                     "control, optimized)"]


def test_external_run_needs_a_command():
    cfg = changed(EXTERNAL, lambda c: c["speedup"]["external"].pop("optimized"))
    assert problems(cfg) == [
        "bitwise.runs.optimized: an external run needs a shell command: set bitwise.runs.optimized.command, or "
        "speedup.external.optimized or speedup.external.command (the default of a run with impl optimized)"]
    # the control brings its own command, so only the run that would fall back on the missing one is named
    cfg["bitwise"]["runs"]["optimized"]["command"] = f"{TRAINER} --impl optimized"
    assert problems(cfg) == []


def test_rl_run_takes_no_command():
    cfg = changed(RL, lambda c: c["bitwise"]["runs"]["optimized"].update(command="python train.py"))
    assert problems(cfg) == ["bitwise.runs.optimized.command: only external runs take a command "
                                     "(bitwise.runs.optimized.subject is rl, which runs python -m workflow_src.subjects.rl)"]


def test_runs_of_another_subject_than_the_reference_are_refused():
    cfg = changed(RL, lambda c: c["bitwise"]["runs"].update(ext={"subject": "external", "impl": "optimized",
                                                                 "command": "python train.py"}))
    [problem] = problems(cfg)
    assert problem.startswith("bitwise.runs.ext.subject is external but the reference bitwise.runs.baseline is rl")


def test_check_config_reports_every_problem_with_its_key():
    """Through check_config, on the default config as the Snakefile sees it (schema defaults filled in)."""
    from snakemake.utils import validate
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    config["bitwise"] = {"reference": "nope", "runs": {"optimized": {"impl": "optimized", "command": "python x.py"}}}
    validate(config, str(REPO / "config/schema.yaml"), set_default=True)
    with pytest.raises(ConfigError) as e:
        check_config(config)
    assert "bitwise.reference: 'nope' is not a run in bitwise.runs (known: optimized)" in str(e.value)
    assert "bitwise.runs.optimized.command: only external runs take a command" in str(e.value)
