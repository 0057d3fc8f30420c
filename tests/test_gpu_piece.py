"""scripts/gpu_piece.sh, the device-window piece, on the CPU in a clone of the checkout: it unpacks the last
piece's results (RESTORE), runs Snakemake, packs results/ for the next piece, and says when the checkout there is
not clean (a file carried outside a git-ignored path). scripts/gpu_tests.sh, the GPU tests with the same setup
(scripts/device_env.sh), runs the tests marked gpu that it is given."""
import os
import shutil
import subprocess
import sys
import tarfile

from conftest import REPO

TARGET = "results/config/environment.json"


def piece(clone, out, restore):
    env = {**os.environ, "RESTORE": restore, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    return subprocess.run(["bash", "scripts/gpu_piece.sh", "300", str(out), "--", TARGET], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=600)


def copy_of_the_checkout(clone):
    """The checkout's files as they are (tracked, and untracked ones git does not ignore) in a fresh repository of
    one commit: what a device host gets."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, clone / name)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(clone)]
    subprocess.run(git[:5] + ["init", "-q", str(clone)], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "copy"], check=True)


def test_a_piece_restores_the_last_pieces_results_and_says_when_the_tree_is_dirty(tmp_path):
    clone = tmp_path / "clone"
    copy_of_the_checkout(clone)
    (clone / "results").mkdir()
    (clone / "results" / "from-the-last-piece.txt").write_text("kept\n")
    (clone / ".whl").mkdir()
    with tarfile.open(clone / ".whl" / "last.tar.gz", "w:gz") as tar:
        tar.add(clone / "results", arcname="results")
    for p in (clone / "results").iterdir():
        p.unlink()
    run = piece(clone, tmp_path / "out1", ".whl/last.tar.gz")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "unpacked .whl/last.tar.gz" in run.stdout and "not clean" not in run.stderr
    head = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert f"gpu_piece: at commit {head.strip()}" in run.stdout
    with tarfile.open(tmp_path / "out1" / "results.tar.gz") as tar:
        names = tar.getnames()
    assert "results/from-the-last-piece.txt" in names and TARGET in names
    # the control: the same file carried outside a git-ignored path leaves the tree dirty there
    (clone / "last.tar.gz").write_bytes((clone / ".whl" / "last.tar.gz").read_bytes())
    run = piece(clone, tmp_path / "out2", "last.tar.gz")
    assert run.returncode == 0 and "the checkout is not clean here (?? last.tar.gz" in run.stderr


def test_a_piece_takes_the_carried_commit_where_the_hosts_git_is_older(tmp_path):
    """The device tool can keep an earlier call's .git beside this checkout's files: the bundle that
    scripts/device_head.sh writes moves HEAD and the index to the files' commit, so the records name it, clean.
    The control: without the bundle the same copy is dirty and names the older commit."""
    clone = tmp_path / "clone"
    copy_of_the_checkout(clone)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(clone)]
    made = subprocess.run(["bash", "scripts/device_head.sh"], cwd=clone, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    files_commit = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    readme = (clone / "README.md").read_bytes()
    (clone / "README.md").write_bytes(readme + b"an older call's text\n")
    subprocess.run(git + ["commit", "-qam", "older"], check=True)  # the host's .git: another commit's
    (clone / "README.md").write_bytes(readme)  # the files: this checkout's
    run = piece(clone, tmp_path / "out1", "")
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"gpu_piece: at commit {files_commit}" in run.stdout and "not clean" not in run.stderr
    (clone / ".whl" / "head.bundle").unlink()
    subprocess.run(git + ["reset", "-q", "HEAD@{1}"], check=True)  # back to the older commit, files untouched
    run = piece(clone, tmp_path / "out2", "")
    assert run.returncode == 0 and "the checkout is not clean here ( M README.md" in run.stderr
    assert f"gpu_piece: at commit {files_commit}" not in run.stdout
    # a checkout that is not clean makes no bundle
    refused = subprocess.run(["bash", "scripts/device_head.sh"], cwd=clone, capture_output=True, text=True)
    assert refused.returncode == 2 and "not clean" in refused.stderr


def test_the_gpu_tests_script_runs_the_tests_marked_gpu_at_the_carried_commit(tmp_path):
    clone = tmp_path / "clone"
    copy_of_the_checkout(clone)
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    run = subprocess.run(["bash", "scripts/gpu_tests.sh", "300", "tests/test_seeded_linear_bench.py"], cwd=clone,
                         env=env, capture_output=True, text=True, timeout=600)
    head = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert f"gpu_tests: at commit {head.strip()}" in run.stdout
    assert "2 skipped" in run.stdout and "deselected" in run.stdout  # only the tests marked gpu, skipped on a CPU
    bad = subprocess.run(["bash", "scripts/gpu_tests.sh", "soon"], cwd=clone, capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr
