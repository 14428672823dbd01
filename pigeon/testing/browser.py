"""A real Chromium for the console's tests and screenshots: Debian's chromium and chromium-driver (the Makefile
installs them; nothing is downloaded), driven with Selenium, headless, with the flags a machine without internet
needs (no background networking, no component updates)."""

from __future__ import annotations

import os
import shutil
import tempfile

CHROMIUM = os.environ.get("PIGEON_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("PIGEON_CHROMEDRIVER", "/usr/bin/chromedriver")


def chromium(width: int = 1400, height: int = 900):
    """A headless Chromium under Selenium; quit() it (its profile directory goes with it)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    if missing:
        raise RuntimeError(f"{', '.join(missing)} missing: `make test` installs Debian's chromium and "
                           "chromium-driver (apt-get install chromium chromium-driver)")
    profile = tempfile.mkdtemp(prefix="pigeon-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    quit_ = driver.quit

    def quit_and_clean():
        try:
            quit_()
        finally:
            shutil.rmtree(profile, ignore_errors=True)

    driver.quit = quit_and_clean
    return driver
