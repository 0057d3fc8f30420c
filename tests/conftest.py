import json
import os
import shutil
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

import pytest
from xdist.scheduler import LoadFileScheduling

# Before any test module imports torch: the package sets the CPU kernel family the workflow's jobs compute with
# (workflow_src/provenance/cpu_kernels.py), so the tests' bits are the jobs' on every machine; the subprocesses
# they start inherit it.
import workflow_src  # noqa: F401

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session", autouse=True)
def machine_lock_of_this_session(tmp_path_factory):
    """The machine lock's default path derives from XDG_RUNTIME_DIR: a session (one per xdist worker) gets its
    own, so launches of concurrent test sessions on one machine do not refuse one another."""
    runtime = tmp_path_factory.mktemp("xdg_runtime")
    old = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)
    yield runtime / "speedproof" / "machine.lock"
    if old is None:
        os.environ.pop("XDG_RUNTIME_DIR", None)
    else:
        os.environ["XDG_RUNTIME_DIR"] = old


def run_module(module: str, *args: str, env: dict | None = None, cwd: Path | None = None,
               check: bool = True) -> subprocess.CompletedProcess:
    """Run `python -m module args` as the workflow's rules do."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd or REPO, env=full_env,
                          capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"{module} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def write_section(path: Path, section: str, value) -> Path:
    from workflow_src.provenance.config_section import section_document
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(section_document(section, value)))
    return path


def make_tiny_checkpoint(directory: Path) -> Path:
    """A minimal safetensors checkpoint directory (not a real model: the checkpoint rule only hashes)."""
    import torch
    from safetensors.torch import save_file
    directory.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    save_file({"w": torch.randn(4, 8, generator=g), "b": torch.zeros(8)}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 8}))
    (directory / "tokenizer.json").write_text(json.dumps({"version": "1.0"}))
    return directory


@pytest.fixture(scope="session")
def rl_subject_checkpoint(tmp_path_factory) -> Path:
    """test_rl_subject's CKPT pretrained on its TASK, built once per session (byte-identical rebuilds are
    tests/test_synthetic_checkpoint.py's concern). test_rl_subject, test_reward_wiring and test_static_engine
    only read it."""
    from test_rl_subject import CKPT, TASK
    return synthetic_checkpoint(CKPT, TASK, tmp_path_factory.mktemp("rl_subject_ckpt") / "ckpt")


def synthetic_checkpoint(spec: dict, task: dict, out: Path) -> Path:
    """A synthetic checkpoint built as the checkpoint rule builds it, MANIFEST.json included (every loader
    verifies the files against it)."""
    from workflow_src.checkpoints.__main__ import build_checkpoint
    build_checkpoint(out.name, "synthetic", spec, task, out, progress=False)
    return out


# --- the tiny workflow of tests/test_workflow.py, run once per session -----------------------------------------

ENVIRONMENT_CHANGE = {"on_pin_mismatch": "warn", "pins": {"torch": ">=2"}}


class TinyWorkflow:
    """test_workflow.TINY run by snakemake, once per session, on one background thread (one run at a time).

    full(): a Future of a directory holding a completed run of every target. tests/test_workflow.py checks
    it, tests/test_slurm.py compares its SLURM run with it (the two files share a worker, so this one run serves
    both). config_changed(): a Future of (directory, dry-run process) for a copy of that run whose config.yaml has
    the environment section set to ENVIRONMENT_CHANGE: the dry run's plan of what reads the section, and the
    environment record rebuilt under it. Nothing writes into full() after it is done (the copy is taken before it
    resolves); a test that writes takes copy_of(full).

    The runs start when a test first asks for them, or earlier with prefetch(): tests/test_slurm.py calls it
    before its SLURM run, which mostly waits on polling, so the local runs take the idle CPU meanwhile.
    A failed run raises, with snakemake's output, in every test that asks for it."""

    def __init__(self, root: Path, want_config_change: bool):
        self.root = root
        self.want_config_change = want_config_change
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tiny-workflow")
        self._full = self._changed = None
        self._lock = threading.Lock()

    def _run_full(self) -> Path:
        import yaml
        from test_workflow import TINY, smk
        wd = self.root / "full"
        wd.mkdir()
        (wd / "config.yaml").write_text(yaml.safe_dump(TINY))
        smk(wd, "--cores", "2")
        # Copies preserve mtimes (copy2), so snakemake sees the copy as up to date too.
        shutil.copytree(wd, self.root / "changed", symlinks=True)
        return wd

    def _run_changed(self):
        import yaml
        from test_workflow import smk
        self._full.result()
        wd = self.root / "changed"
        cfg = yaml.safe_load((wd / "config.yaml").read_text())
        cfg["environment"] = ENVIRONMENT_CHANGE
        (wd / "config.yaml").write_text(yaml.safe_dump(cfg))
        plan = smk(wd, "-n", "--cores", "2")
        # the plan is what the test checks; of the rerun it reads the environment record only, so only that runs
        # (the whole rerun, every launch and RandOpt job again, would take the CPU from the SLURM run's jobs)
        smk(wd, "--cores", "2", "results/env/environment.json")
        return wd, plan

    def full(self) -> Future:
        with self._lock:
            if self._full is None:
                self._full = self._pool.submit(self._run_full)
            return self._full

    def config_changed(self) -> Future:
        self.full()
        with self._lock:
            if self._changed is None:
                self._changed = self._pool.submit(self._run_changed)
            return self._changed

    def prefetch(self):
        """Start the runs that this session's tests will ask for."""
        self.full()
        if self.want_config_change:
            self.config_changed()

    def settle(self):
        """Wait for every started run (its failure is left for the tests that ask for it)."""
        wait([f for f in (self._full, self._changed) if f is not None])

    def copy_of(self, tmp_path: Path) -> Path:
        dest = tmp_path / "wf"
        shutil.copytree(self.full().result(), dest, symlinks=True)
        return dest

    def close(self):
        self._pool.shutdown(wait=True)


@pytest.fixture(scope="session")
def tiny_workflow(request, tmp_path_factory):
    want = any("tiny_config_changed" in getattr(item, "fixturenames", ()) for item in request.session.items)
    runs = TinyWorkflow(tmp_path_factory.mktemp("tiny_workflow"), want_config_change=want)
    yield runs
    runs.close()


@pytest.fixture
def tiny_config_changed(tiny_workflow):
    """(directory, dry-run process) of TinyWorkflow.config_changed()."""
    return tiny_workflow.config_changed().result()


# --- the suite over two workers (pytest-xdist, `make test`: -n 2 --dist loadfile --no-loadscope-reorder) --------

# The files that run the tiny workflow (tests/test_slurm.py's SLURM run beside the local runs, tests/test_workflow.py's
# checks of them) share one worker, so the session's local runs (session fixtures are a worker's own) are made once
# for both; collected first, they start at once while the other worker takes the other files, one file at a time.
TINY_WORKFLOW_FILES = ("test_slurm.py", "test_workflow.py")


def pytest_collection_modifyitems(config, items):
    first = [item for name in TINY_WORKFLOW_FILES for item in items if item.path.name == name]
    taken = set(map(id, first))
    items[:] = first + [item for item in items if id(item) not in taken]


class _TinyWorkflowFilesTogether(LoadFileScheduling):
    """loadfile, with the tiny workflow's files as one scope."""

    def _split_scope(self, nodeid: str) -> str:
        scope = super()._split_scope(nodeid)
        return "tiny-workflow" if Path(scope).name in TINY_WORKFLOW_FILES else scope


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") == "loadfile":
        return _TinyWorkflowFilesTogether(config, log)
    return None
