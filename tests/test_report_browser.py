"""The report as a person first sees it: rendered by headless Chromium at 1400 px wide,
the verdict (headline, SLOs, goodput, TTFT and TPOT p99) lies within the first screen,
for a run's report, a compare folder's and a sweep folder's. Skips where no Chromium is
found (``find_browser``; CI installs it: ``.ci/run``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from stepplan.sim.cli import main

WIDTH, SCREEN = 1400, 900
#: Where Playwright keeps the Chromium it downloads (``playwright install chromium``).
PLAYWRIGHT = Path(
    os.environ.get("PLAYWRIGHT_BROWSERS_PATH") or Path.home() / ".cache/ms-playwright"
)


def find_browser() -> str | None:
    """``$STEPPLAN_CHROMIUM``, else a Chromium on the PATH, else Playwright's newest."""
    if os.environ.get("STEPPLAN_CHROMIUM"):
        return os.environ["STEPPLAN_CHROMIUM"]
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    downloaded = sorted(PLAYWRIGHT.glob("chromium-*/chrome-linux*/chrome"))
    return str(downloaded[-1]) if downloaded else None


BROWSER = find_browser()
pytestmark = pytest.mark.skipif(
    BROWSER is None, reason="no chromium here (apt-get install chromium)"
)
WORKLOAD = "synthetic:n=300,rate=60,prompt=uniform:16:2000,output=uniform:2:200"
SWEEP_FILE = f'traces = ["{WORKLOAD}"]\n[grid]\nscheduler.num_spec_tokens = [1, 3]\n'
#: Appended to a copy of the page: writes where the verdict lies into the DOM Chromium dumps.
PROBE = (
    "<script>const box = document.getElementById('verdict').getBoundingClientRect();"
    "document.body.insertAdjacentHTML('beforeend', '<pre id=\"probe\">' + JSON.stringify("
    "{top: box.top, bottom: box.bottom, width: window.innerWidth}) + '</pre>');</script>"
)


def verdict_box(page: Path, tmp_path: Path) -> dict:
    probed = tmp_path / f"probed-{page.parent.name}.html"
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    command = [
        BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        f"--window-size={WIDTH},{SCREEN}", "--dump-dom", probed.as_uri(),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    # The script's own text holds the tag too: the element it wrote comes last.
    found = re.findall(r'<pre id="probe">(\{[^<]*)</pre>', done.stdout)
    assert found, done.stderr[-2000:]
    return json.loads(found[-1])


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("browser")
    run = folder / "run"
    assert main(["simulate", WORKLOAD, "--quiet", "--out", str(run), "--report"]) == 0
    pair = folder / "pair"
    args = ["compare", WORKLOAD, "--quiet", "--out", str(pair), "--b-host-cost", "seed"]
    assert main(args) == 0
    assert main(["report", str(pair)]) == 0
    swept = folder / "sweep"
    (folder / "sweep.toml").write_text(SWEEP_FILE)
    args = ["sweep", str(folder / "sweep.toml"), "--out", str(swept), "--quiet", "--workers", "1"]
    assert main(args) == 0
    assert main(["report", str(swept)]) == 0
    return {
        "run": run / "report.html",
        "compare": pair / "report.html",
        "sweep": swept / "report.html",
    }


def test_a_sweep_reports_headline_is_on_the_first_screen(pages, tmp_path):
    box = verdict_box(pages["sweep"], tmp_path)
    assert 0 <= box["top"] < box["bottom"] <= SCREEN, box
    page = pages["sweep"].read_text()
    verdict = page[page.index("<section id='verdict'") : page.index("</section>")]
    assert "Sweep over scheduler.num_spec_tokens (2 points): " in verdict
    assert "meet slo" in verdict and "best for slo" in verdict


@pytest.mark.parametrize("kind", ["run", "compare"])
def test_the_verdict_is_on_the_first_screen(pages, kind, tmp_path):
    box = verdict_box(pages[kind], tmp_path)
    assert box["width"] == WIDTH
    assert 0 <= box["top"] < box["bottom"] <= SCREEN, box
    page = pages[kind].read_text()
    verdict = page[page.index("<section id='verdict'") : page.index("</section>")]
    for words in ("goodput", "TTFT p99", "TPOT p99", "TTFT p99 &lt;= 1,000 ms", "model hybrid-8b"):
        assert words in verdict, words
    if kind == "compare":
        assert "B differs in cost.host_cost: model -&gt; seed" in verdict
