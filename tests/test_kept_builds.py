"""A run's synthetic checkpoint against the kept records of the same build (workflow_src/report/kept_builds.py)."""
import copy
import json

import pytest

from workflow_src.report import kept_builds
from workflow_src.report.summary import main as summary_main

BUILD = {"checkpoint.synthetic": "a" * 64, "task.synthetic_arithmetic": "b" * 64}


def run_record(files_sha256: str, machine: str = "CPU AMD EPYC (2 cores, x86-avx2 kernels)", **changes) -> dict:
    record = {"model": {"name": "tiny-arith", "checkpoint_source": "synthetic", "checkpoint_files_sha256": files_sha256},
              "provenance": {"config_sections": {**BUILD, "randopt": "c" * 64}},
              "hardware": {"torch": "2.13.0+cpu", "cpu_kernels": {"family": "x86-avx2"}, "summary": machine}}
    for dotted, value in changes.items():
        *parents, key = dotted.split(".")
        node = record
        for p in parents:
            node = node[p]
        node[key] = value
    return record


def keep(tmp_path, name: str, *raws) -> None:
    (tmp_path / name).mkdir()
    (tmp_path / name / "record.json").write_text(json.dumps({"kind": "randopt", "raw": list(raws)}))


def test_the_same_build_on_another_machine_says_same_or_other_bytes(tmp_path):
    keep(tmp_path, "randopt-default", run_record("1" * 64))
    kept = kept_builds.kept_records(tmp_path)
    same = kept_builds.lines(run_record("1" * 64, "CPU Intel(R) Xeon(R) (2 cores, x86-avx2 kernels)"), kept)
    assert len(same) == 1 and "**the same bytes**" in same[0] and "randopt-default/record.json" in same[0]
    assert "Intel" in same[0] and "AMD EPYC" in same[0]
    other = kept_builds.lines(run_record("2" * 64, "CPU Intel(R) Xeon(R) (2 cores, x86-avx2 kernels)"), kept)
    assert len(other) == 1 and "**other bytes**" in other[0] and "1111111111111111" in other[0] \
        and "2222222222222222" in other[0] and "probe_ops" in other[0]


@pytest.mark.parametrize("change", [{"provenance.config_sections": {**BUILD, "checkpoint.synthetic": "d" * 64}},
                                    {"provenance.config_sections": {**BUILD, "task.synthetic_arithmetic": "d" * 64}},
                                    {"hardware.torch": "2.14.0+cpu"}, {"hardware.cpu_kernels": {"family": "machine"}},
                                    {"model.name": "tiny-other"}, {"hardware.cpu_kernels": {}}])
def test_another_build_is_no_comparison(tmp_path, change):
    """Other spec, task, torch, kernel family or model (or a record that does not name its family): other bytes
    are allowed there, so nothing is said."""
    keep(tmp_path, "r", run_record("1" * 64, **change))
    assert kept_builds.lines(run_record("2" * 64), kept_builds.kept_records(tmp_path)) == []


def test_downloaded_checkpoints_and_other_kinds_of_record_are_left_out(tmp_path):
    keep(tmp_path, "hf", run_record("1" * 64, **{"model.checkpoint_source": "hf"}))
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl" / "record.json").write_text(json.dumps({"kind": "rl", "raw": [run_record("1" * 64)]}))
    assert kept_builds.kept_records(tmp_path) == []
    assert kept_builds.lines(run_record("1" * 64, **{"model.checkpoint_source": "hf"}),
                             [("x", run_record("1" * 64))]) == []


def test_the_summary_has_a_checkpoint_section_only_with_a_kept_record_of_the_build(tmp_path):
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    keep(evidence, "randopt-default", run_record("1" * 64))
    record = run_record("2" * 64)
    record.update(record_id="f" * 64, seeds_per_s=1.0, generation={"engine": "static"},
                  population={"best_sigma": 0.002, "base_train_reward": 0.25, "share_above_base": 0.5},
                  accuracy={"headline": {"k": 16, "rule": "largest K", "accuracy": 0.25, "base_accuracy": 0.24,
                                         "n": 256, "delta": 0.01, "ci_level": 0.95, "ci_low": -0.01,
                                         "ci_high": 0.02, "mcnemar_p": 0.6, "within_noise": True}})
    (tmp_path / "record.json").write_text(json.dumps(record))
    args = ["--randopt", str(tmp_path / "record.json"), "--experiment", "e", "--checkpoint", "tiny-arith",
            "--source", "synthetic", "--md", str(tmp_path / "s.md"), "--rst", str(tmp_path / "s.rst")]
    summary_main([*args, "--evidence", str(evidence)])
    md = (tmp_path / "s.md").read_text()
    assert "## Checkpoint" in md and "**other bytes**" in md
    summary_main(args)
    assert "## Checkpoint" not in (tmp_path / "s.md").read_text()
    other = copy.deepcopy(record)
    other["hardware"]["torch"] = "2.14.0+cpu"
    (tmp_path / "record.json").write_text(json.dumps(other))
    summary_main([*args, "--evidence", str(evidence)])
    assert "## Checkpoint" not in (tmp_path / "s.md").read_text()
