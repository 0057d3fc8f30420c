"""The packaged workflow: `pip install .` copies the files Snakemake reads (Snakefile, rules/, config/, envs/,
profiles/, the report's captions) into the package as workflow_src/_workflow/, where the `speedproof` command
finds them (workflow_src.config_schema.workflow_dir). An editable install and a clone read them in place."""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
WORKFLOW_FILES = ("Snakefile", "rules", "config", "envs", "profiles", "workflow_src/report/captions")


class BuildWithWorkflow(build_py):
    def run(self):
        super().run()
        if self.editable_mode:
            return
        target = Path(self.build_lib) / "workflow_src" / "_workflow"
        for name in WORKFLOW_FILES:
            src, dst = ROOT / name, target / name
            if src.is_dir():
                shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)


setup(cmdclass={"build_py": BuildWithWorkflow})
