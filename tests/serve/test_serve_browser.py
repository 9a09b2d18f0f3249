"""The web page in a real headless browser: upload jfk.wav, read the streamed transcript.

Debian's chromium and chromedriver (apt); the driver's path is given, so selenium-manager
never looks for one on the network. Skips, saying why, when either is missing.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from serve_helpers import JFK, KEY, ServerProcess

CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
SCREENSHOT = Path(os.environ.get("TENSORPLAN_SCREENSHOT", "/tmp/tensorplan-serve-page.png"))


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser() -> Any:
    webdriver = pytest.importorskip("selenium.webdriver")
    binary = _chromium()
    if binary is None or not Path(CHROMEDRIVER).exists():
        reason = "chromium and chromium-driver are not installed (apt-get install chromium " \
                 "chromium-driver)"
        print(f"\nSKIP browser test: {reason}")
        pytest.skip(reason)
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--disable-gpu", "--window-size=1000,800"):
        options.add_argument(arg)
    from selenium.webdriver.chrome.service import Service

    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


@pytest.mark.slow
def test_upload_and_watch_the_transcript(browser: Any, server: ServerProcess,
                                         reference: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server.url + "/")
    key = browser.find_element(By.ID, "key")
    key.clear()
    key.send_keys(KEY)
    browser.find_element(By.ID, "file").send_keys(str(JFK))
    status = browser.find_element(By.ID, "status")
    WebDriverWait(browser, 120).until(lambda _: status.text in ("done",)
                                      or status.text.startswith("error"))
    assert status.text == "done"
    rows = browser.find_elements(By.CSS_SELECTOR, "#segments li")
    want = reference()
    assert len(rows) == len(want.segments)
    page_text = " ".join(r.text.split("  ", 1)[-1] for r in rows)
    for segment, row in zip(want.segments, rows, strict=True):
        assert row.text.endswith(segment.text.strip())
    assert "ask not what your country can do for you" in page_text
    assert browser.find_element(By.ID, "downloads").is_displayed()
    outputs = browser.execute_script("return Object.keys(outputs)")
    assert sorted(outputs) == ["json", "srt", "txt", "vtt"]
    browser.save_screenshot(str(SCREENSHOT))


@pytest.mark.slow
def test_a_wrong_key_shows_the_error(browser: Any, server: ServerProcess) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server.url + "/")
    key = browser.find_element(By.ID, "key")
    key.clear()
    key.send_keys("not-the-key")
    browser.find_element(By.ID, "file").send_keys(str(JFK))
    WebDriverWait(browser, 60).until(
        ec.text_to_be_present_in_element((By.ID, "status"), "error 401"))
