from conftest import REPO

from workflow_src.report.config_doc import render


def test_config_readme_matches_schema():
    assert (REPO / "config/README.md").read_text() == render(), \
        "config/README.md is stale: python -m workflow_src.report.config_doc > config/README.md"
