"""The web UI in a real browser: Debian's headless Chromium, driven by Playwright, against a
real dashboard process reading a real cluster. Screenshots land in tests/artifacts/."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal

import pytest
from playwright.async_api import Page, async_playwright, expect

from gearbus.artifact import pack
from shared import subjects
from shared.messages import AppState
from tests.support.cluster import wait_state, wait_until
from tests.support.dashboard import Dashboard
from tests.support.paths import APPS, REPO, TICKER

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = os.path.join(REPO, "tests", "artifacts")
FAILING = os.path.join(APPS, "failing.py")
# As root, in a sandbox with no outside network: no Chromium sandbox, and none of its calls home.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update"]
UI_TIMEOUT_MS = 30_000


@pytest.fixture
async def page():
    if not os.path.exists(CHROMIUM):  # never skipped: a missing browser is a failed test
        pytest.fail(f"no Chromium at {CHROMIUM}: install Debian's chromium package (.ci/run does)", pytrace=False)
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = await browser.new_page(viewport={"width": 1300, "height": 900})
            page.set_default_timeout(UI_TIMEOUT_MS)
            expect.set_options(timeout=UI_TIMEOUT_MS)
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.on("console", lambda message: message.type == "error" and not message.text.startswith(
                "Failed to load resource") and errors.append(message.text))  # HTTP errors are expected
            yield page
            assert not errors, f"the page raised: {errors}"
        finally:
            await browser.close()


async def screenshot(page: Page, name: str) -> None:
    os.makedirs(ARTIFACTS, exist_ok=True)
    await page.screenshot(path=os.path.join(ARTIFACTS, name), full_page=True)


async def records_out(page: Page, processor: int) -> int:
    """The processor's records out as the page's processor table shows them (exact below 10k)."""
    row = page.locator("#processors tbody tr").nth(processor)
    return int(await row.locator("td").nth(4).inner_text())


async def test_the_app_page_draws_the_dag_updates_live_and_kills_with_the_button(cluster, client, tmp_path, page):
    running = await client.submit(pack(TICKER), ["--output", str(tmp_path / "ticks.jsonl"), "--rate", "50"])
    await wait_state(client, running, AppState.ACTIVE)
    victim = next(pid for pid, _, kind in cluster.processes() if kind == "executor")
    os.kill(victim, signal.SIGKILL)  # a restart before the dashboard starts: on its timeline all the same

    async def restarted():
        return any(e.kind == "restart" for e in (await client.status(running)).events) or None

    await wait_until(client, subjects.appmaster_heartbeat("*"), restarted)

    async with Dashboard(cluster.url, sample_s=0.5) as dashboard:
        await page.goto(dashboard.url + "/")
        app_link = page.locator("#apps tbody a", has_text="ticker")
        await expect(app_link).to_have_attribute("href", f"/apps/{running}")
        await expect(page.locator("#workers tbody tr")).to_have_count(2)
        await expect(page.locator("#masters tbody")).to_contain_text("leader")
        await screenshot(page, "dashboard-cluster.png")

        await app_link.click()
        await expect(page).to_have_url(f"{dashboard.url}/apps/{running}")
        await expect(page.locator("#app-state")).to_have_text("ACTIVE")
        _, dag = await dashboard.json("GET", f"/api/v1/apps/{running}/dag")
        nodes = page.locator("#dag .dag-node")
        await expect(nodes).to_have_count(len(dag["processors"]))
        for processor in dag["processors"]:  # names and figures are text in the SVG
            node = page.locator(f'#dag .dag-node[data-processor="{processor["id"]}"]')
            await expect(node).to_contain_text(processor["name"])
            await expect(node).to_contain_text(f"×{processor['parallelism']}")
        await expect(page.locator("#dag .dag-edge")).to_have_count(len(dag["edges"]))
        await expect(nodes.first).to_contain_text("/s")
        await expect(page.locator("#tasks tbody tr")).to_have_count(
            sum(p["parallelism"] for p in dag["processors"]))
        first_processor = dag["processors"][0]["name"]  # tasks named as status names them, e.g. count[1]
        await expect(page.locator("#tasks tbody tr").first.locator("td").first).to_have_text(f"{first_processor}[0]")

        await expect(page.locator("#processors tbody tr")).to_have_count(len(dag["processors"]))
        first = await records_out(page, 0)
        async with asyncio.timeout(30):  # the page refreshes itself: the source's count grows
            while await records_out(page, 0) <= first:
                await page.wait_for_timeout(250)
        completed = page.locator("#checkpoints tbody tr", has_text="completed")
        await expect(completed.first).to_be_visible()  # the ticker checkpoints every second
        newest = int(await completed.first.locator("td").first.inner_text())
        _, checkpoints = await dashboard.json("GET", f"/api/v1/apps/{running}/checkpoints")
        assert newest in [c["checkpoint_id"] for c in checkpoints["history"] if c["status"] == "completed"]
        # the charts: a line per processor on each, sampled by the dashboard; the timeline
        for figure in ("records_in_per_s", "backpressure", "watermark_lag_ms", "state_bytes"):
            await expect(page.locator(f'#charts figure[data-figure="{figure}"] polyline.series')).to_have_count(
                len(dag["processors"]))
        for processor in dag["processors"]:
            await expect(page.locator("#chart-legend")).to_contain_text(processor["name"])
        _, series = await dashboard.json("GET", f"/api/v1/apps/{running}/series")
        assert len(series["samples"]) >= 1 and series["window_s"] == 900
        assert any(s["processors"]["0"]["records_in_per_s"] >= 0 for s in series["samples"])
        await expect(page.locator("#timeline-strip .tick.checkpoint_completed").first).to_be_attached()
        restart = page.locator("#timeline tbody tr", has_text="restart 1")  # from before it started
        await expect(restart).to_be_visible()
        await expect(page.locator("#timeline-strip circle.mark.restart")).to_have_count(1)
        await expect(page.locator("#versions tbody tr")).to_have_count(1)
        await expect(page.locator("#versions tbody tr")).to_contain_text("running")

        # a rescale started from the page: the same checks as the command line, then on the timeline
        async def accept(dialog):
            assert dialog.type == "confirm" and str(running) in dialog.message and "stamp" in dialog.message
            await dialog.accept()

        async def running_again():  # the restart's recovery is over: a rescale meanwhile is refused
            return (await client.stimuli(running)).phase == "running" or None

        await wait_until(client, subjects.appmaster_heartbeat("*"), running_again)
        await page.locator("#rescale-processor").select_option("stamp")
        await page.locator("#rescale-parallelism").fill("3")
        page.once("dialog", accept)
        await page.locator("#rescale").click()
        await expect(page.locator("#action-result")).to_contain_text("stamp ×3")
        await expect(page.locator('#dag .dag-node[data-processor="1"]')).to_contain_text("×3")
        await expect(page.locator("#timeline tbody tr", has_text="stamp 2 → 3")).to_be_visible()
        await expect(page.locator("#tasks tbody tr")).to_have_count(
            sum(p["parallelism"] for p in dag["processors"]) + 1)
        await page.locator("#rescale-processor").select_option("write")
        await page.locator("#rescale-parallelism").fill("2")
        page.once("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
        await page.locator("#rescale").click()  # a sink's open transactions cannot be divided
        await expect(page.locator("#action-result")).to_contain_text("rescale failed")
        await expect(page.locator("#action-result")).to_contain_text("cannot be divided")
        await screenshot(page, "dashboard-app-running.png")

        async def confirm(dialog):
            assert dialog.type == "confirm" and str(running) in dialog.message
            await dialog.accept()

        page.once("dialog", confirm)
        await page.locator("#kill").click()
        await expect(page.locator("#app-state")).to_have_text("TERMINATED")
        await expect(page.locator("#kill")).to_be_disabled()
        assert (await client.status(running)).state == AppState.TERMINATED
        await expect(page.locator("#dag .dag-node.idle")).to_have_count(len(dag["processors"]))
        await screenshot(page, "dashboard-app-killed.png")


async def test_a_failed_app_shows_its_traceback_and_a_lost_cluster_shows_a_banner(cluster, client, page):
    failed = await client.submit(pack(FAILING), [])
    assert (await client.wait(failed, timeout=60)).state == AppState.FAILED

    async with Dashboard(cluster.url) as dashboard:
        await page.goto(f"{dashboard.url}/apps/{failed}")
        await expect(page.locator("#app-state")).to_have_text("FAILED")
        await expect(page.locator("#error")).to_be_visible()
        await expect(page.locator("#error-message")).to_contain_text("cannot handle record 42")
        await expect(page.locator("#error-message")).to_contain_text("[user error: step picky, at failing.py:9]")
        await expect(page.locator("#error-traceback")).to_contain_text("Traceback")
        await expect(page.locator("#kill")).to_be_disabled()
        await screenshot(page, "dashboard-app-failed.png")

        await page.goto(f"{dashboard.url}/apps/999")
        await expect(page.locator("#app-name")).to_contain_text("999")

        await page.goto(f"{dashboard.url}/apps/{failed}")
        await expect(page.locator("#app-state")).to_have_text("FAILED")
        await asyncio.to_thread(cluster.nats.stop)
        await expect(page.locator("#banner")).to_contain_text("cluster unreachable")
        await screenshot(page, "dashboard-cluster-unreachable.png")
        await asyncio.to_thread(cluster.nats.start)
        await expect(page.locator("#banner")).to_be_hidden()
