import json

from conftest import run_module, write_section

from workflow_src.provenance.environment import check_pins, fingerprint, relevant_variables


def test_check_pins_rows():
    pkgs = {"torch": "2.13.0+cpu", "snakemake": "9.27.1", "flash-attn": None}
    pkgs = {k: v for k, v in pkgs.items() if v}
    rows = {r["package"]: r for r in check_pins(
        {"torch": "2.13.0", "snakemake": ">=9,<10", "flash_attn": "2.5.8", "Triton": "3.5.1"}, pkgs)}
    assert rows["torch"]["ok"]            # a local label (+cpu) still satisfies ==2.13.0
    assert rows["snakemake"]["ok"]
    assert not rows["flash_attn"]["ok"] and rows["flash_attn"]["installed"] is None
    assert not rows["Triton"]["ok"]
    assert not check_pins({"torch": "2.9.1"}, pkgs)[0]["ok"]


def test_fingerprint_hash_is_stable_and_leaves_out_circumstance():
    a, b = fingerprint({"torch": "2.9.1"}), fingerprint({"torch": "2.9.1"})
    assert a["env_hash"] == b["env_hash"]
    for key in ("python", "platform", "cpu", "packages", "torch", "gpu", "variables", "git", "hostname",
                "memory_bytes", "collected_at", "pins"):
        assert key in a
    assert a["packages"]["torch"].startswith(a["torch"]["version"].split("+")[0])


def test_relevant_variables():
    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "NCCL_DEBUG": "INFO", "HOME": "/root", "OMP_NUM_THREADS": "2"}
    assert relevant_variables(env) == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "NCCL_DEBUG": "INFO",
                                       "OMP_NUM_THREADS": "2"}


def test_pin_policy_warn_records_and_fail_stops(tmp_path):
    section = {"pins": {"torch": "1.0.0"}, "on_pin_mismatch": "warn"}
    s = write_section(tmp_path / "env.json", "environment", section)
    out = tmp_path / "environment.json"
    proc = run_module("workflow_src.provenance.environment", "--config-section", str(s), "--out", str(out))
    run_module("workflow_src.report.environment_summary", "--environment", str(out), "--out",
               str(tmp_path / "summary.html"))
    doc = json.loads(out.read_text())
    assert doc["pins_ok"] is False and "pin mismatch: torch" in proc.stderr
    assert "MISMATCH" in (tmp_path / "summary.html").read_text()

    s = write_section(tmp_path / "env2.json", "environment", {**section, "on_pin_mismatch": "fail"})
    out2 = tmp_path / "environment2.json"
    proc = run_module("workflow_src.provenance.environment", "--config-section", str(s), "--out", str(out2),
                      check=False)
    assert proc.returncode != 0 and "pins not met (torch)" in proc.stderr and not out2.exists()
