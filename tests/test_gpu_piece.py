"""scripts/gpu_piece.sh, the device-window piece, on the CPU in a clone of the checkout: it unpacks the last
piece's results (RESTORE), runs Snakemake, packs results/ for the next piece, and says when the checkout there is
not clean (a file carried outside a git-ignored path)."""
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
