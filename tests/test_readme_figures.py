"""The README's bucketing section is what the current code gives (``bench/readme_figures.py``
regenerates it): the whole bundled trace simulated, its buckets compared, the text matched."""

from __future__ import annotations

import sys
from pathlib import Path

from stepplan.sim.results.sim_result import read_results

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import readme_figures

ROOT = readme_figures.ROOT


def test_readme_bucketing_section_matches_the_code(tmp_path):
    folder = tmp_path / "azure-code-q4"
    readme_figures.run(["simulate", str(readme_figures.TRACE), "--out", str(folder), "--quiet"])
    text = readme_figures.section(read_results(folder), readme_figures.FIGURE)
    readme = (ROOT / "README.md").read_text()
    assert text in readme, "README.md is stale: run python bench/readme_figures.py"
    assert "`python bench/readme_figures.py`" in readme
