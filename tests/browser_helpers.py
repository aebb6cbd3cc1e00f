"""What the browser tests do on the page (Playwright pages of the app): fill a job, read and wait for the status."""
from __future__ import annotations

import pytest

try:
    from playwright.sync_api import TimeoutError as PageTimeout
except ImportError:  # pragma: no cover - the browser tests skip themselves (require_browser)
    PageTimeout = TimeoutError

SECTIONS_OF = {1.2: 1, 2.4: 2, 3.6: 3, 4.8: 4, 9.6: 8}          # seconds -> sections at the default window (tiny preset)


def wait_ready(page) -> None:
    """Wait until the page's own load events have answered (the prompt's token count shows): the page's buttons
    then do what they say. A click on Start as soon as the button showed was once lost with the machine busy (the
    test waited 40 s for a pop-up that never came)."""
    page.wait_for_selector("#start-btn")
    page.wait_for_function("() => document.querySelector('#prompt-tokens')?.innerText.includes('tokens')")


def set_number(page, elem_id, value):
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def fill_job(page, image, *, prompt="a cat walks through the grass", seconds=1.2, steps=3, mode=None,
             wait_image=False):
    """Upload `image`, type the prompt, set seconds and steps (and the mode), then wait until the live hint has
    recomputed the plan from the values the server received."""
    page.locator("#start-image input[type=file]").set_input_files(str(image))
    if wait_image:
        page.wait_for_selector("#start-image img")
    page.locator("#prompt textarea").fill(prompt)
    if mode == "f1":
        page.locator("#mode label").filter(has_text="F1").click()
    n = SECTIONS_OF[seconds]
    type_numbers(page, {"seconds": seconds, "steps": steps}, "hints", [f"{n} section"])


def type_numbers(page, typed: dict, shown_in: str, words: list[str]) -> None:
    """Type each value of `typed` into its number box (by elem_id), then wait until the element `shown_in` says
    every one of `words`. A value the box lost (the driver's typing, while the page re-renders) is typed again, up
    to three times; if the boxes hold what was typed and the text never follows, that is the app's fault and fails
    at once."""
    js = "[" + ",".join(repr(w) for w in words) + "]"
    shows = f"() => {js}.every(w => document.querySelector('#{shown_in}').innerText.includes(w))"
    for attempt in range(3):
        for name, value in typed.items():
            set_number(page, name, value)
        try:
            page.wait_for_function(shows, timeout=60_000 if attempt < 2 else 120_000)
            return
        except PageTimeout:
            boxes = {name: page.locator(f"#{name} input[type=number]").input_value() for name in typed}
            text = page.locator(f"#{shown_in}").inner_text()
        # the boxes hold what was typed: the text did not follow them (the app's fault: ui/panel_controls.live_display)
        if all(float(boxes[name] or "nan") == value for name, value in typed.items()):
            raise AssertionError(f"#{shown_in} never said {words} with {boxes} in the boxes: {text!r}")
        print(f"type_numbers: a typed value was lost (the boxes hold {boxes}); typing again")   # the driver's
    raise AssertionError(f"the boxes never kept {typed}: {boxes}; #{shown_in} {text!r}")


def status(page) -> str:
    return page.locator("#status").inner_text()


def wait_status(page, *words, timeout=180_000):
    """Wait until the status shows one of `words`; returns it."""
    words_js = "[" + ",".join(repr(w) for w in words) + "]"
    try:
        page.wait_for_function(f"() => {words_js}.some(w => document.querySelector('#status').innerText.includes(w))",
                               timeout=timeout)
    except PageTimeout as e:        # say what the page showed instead (Playwright's timeout says only "exceeded")
        shown = page.evaluate("() => ['#status', '#progress'].map(s => document.querySelector(s)?.innerText)")
        raise AssertionError(f"waited {timeout / 1000:.0f} s for {words}; status {shown[0]!r}, "
                             f"progress {shown[1]!r}") from e
    return status(page)


def open_newest_past_job(page, job_id: str, tries: int = 4) -> None:
    """Open Past jobs, refresh it and select the job `job_id` among its newest tiles (its details shown). Job ids
    start with the second they were made, so two jobs of one second may come in either order (the CI failed so once,
    120 s waiting for details that never came); a click that lands before the refreshed gallery replaced the old
    one selects an older job: then refresh and look again."""
    page.locator("#past-jobs").get_by_text("Past jobs").click()
    shows = f"() => document.querySelector('#job-details')?.innerText.includes('{job_id}')"
    for attempt in range(tries):
        page.locator("#jobs-refresh").click()
        tiles = page.locator("#jobs-gallery button.thumbnail-item")
        tiles.first.wait_for()
        for n in range(min(tiles.count(), 3)):
            tiles.nth(n).click()
            try:
                page.wait_for_function(shows, timeout=5_000 * (attempt + 1))
                return
            except PageTimeout:
                pass
    raise AssertionError(f"Past jobs never showed job {job_id}: details {page.locator('#job-details').inner_text()!r}")


def queue_table(page) -> list[list[str]]:
    """The Queue panel's rows as shown (Gradio's data frame: grid cells by row and column; ui/panel_queue.HEADERS)."""
    return page.evaluate("""() => {
        const rows = {};
        for (const cell of document.querySelectorAll('#queue-table [role=gridcell][data-row]')) {
            const r = +cell.dataset.row, c = +cell.dataset.col;
            (rows[r] = rows[r] || [])[c] = cell.textContent.trim();
        }
        return Object.keys(rows).sort((a, b) => a - b).map(r => rows[r]).filter(r => r.length > 2 && r[1]);
    }""")


# Gradio 6.31's app loader ("Loading..." while the page starts) has a progress tracker whose timer re-arms itself on
# every animation frame while its status is "pending", and the loader is removed from the page while it is: nothing
# tells the removed tracker to stop (js/statustracker, `W&&ze()`), so every open page of the app asks for a new frame
# 60 times a second for as long as it is open. A headless Chromium draws those frames in software: ~0.25 of a core per
# idle page, a large cost of the browser tests (measured 2026-12-02: an idle page 0.39 of a core with the
# loop, 0.15 without). The test browser is served that one file with the loop ended once its tracker has left the
# page; where the file is not as expected (another Gradio), Gradio's own is served.
TRACKER_FILE = "**/assets/statustracker-*.js"
TRACKER_LOOP = "function ze(){me(()=>{"
TRACKER_LOOP_ENDED = "function ze(){me(()=>{if($?.isConnected)$.__shown=1;else if($?.__shown)return;"
# The page's video autoplays and loops (ui/layout.py); Chromium decodes and draws it in software here: a page
# showing a finished job's video took 1.2 cores (0.26 with the video paused). No test watches a video play (they read
# its element and files), so the test browser pauses a video as soon as it starts, as a user may.
PAUSE_VIDEOS_JS = "document.addEventListener('play', (e) => e.target.pause(), true);"
WAIT_POLL_MS = 50       # page.wait_for_function's polling here, not every animation frame (Playwright's default):
#                         a wait on every frame made Chromium draw 60 frames a second while a test waited for a job


def _tracker_route(route):
    response = route.fetch()
    body = response.text()
    if body.count(TRACKER_LOOP) != 1:
        return route.fulfill(response=response)
    route.fulfill(response=response, body=body.replace(TRACKER_LOOP, TRACKER_LOOP_ENDED))


class AppBrowser:
    """A Playwright browser whose pages and contexts get the tracker file and the paused videos above (everything
    else as Playwright's)."""

    def __init__(self, browser):
        self._browser = browser

    def new_context(self, **kwargs):
        context = self._browser.new_context(**kwargs)
        context.route(TRACKER_FILE, _tracker_route)
        context.add_init_script(PAUSE_VIDEOS_JS)
        return context

    def new_page(self, **kwargs):
        """A page in a context of its own, as Browser.new_page makes it (the context is closed with the browser)."""
        return self.new_context(**kwargs).new_page()

    def __getattr__(self, name):
        return getattr(self._browser, name)


def chromium():
    """Debian's Chromium driven by Playwright, headless (a generator for a pytest fixture): an AppBrowser, with
    `Page.wait_for_function` polling every WAIT_POLL_MS unless a test says otherwise."""
    from playwright.sync_api import Page, sync_playwright

    from tests.server_helpers import CHROMIUM, CHROMIUM_ARGS

    wait = Page.wait_for_function

    def wait_for_function(self, expression, *, arg=None, timeout=None, polling=WAIT_POLL_MS):
        return wait(self, expression, arg=arg, timeout=timeout, polling=polling)

    Page.wait_for_function = wait_for_function
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
            yield AppBrowser(b)
            b.close()
    finally:
        Page.wait_for_function = wait


def open_chromium():
    """`chromium()` as a context manager, for a test that opens its browser itself."""
    import contextlib

    return contextlib.contextmanager(chromium)()


EXPECT_TIMEOUT_MS = 60_000     # Playwright's default, 5 s, once ran out before a page's Save answered (a quiet run on
                               # three workers: the app's server shares its test worker's core with the job it runs)


def require_browser():
    """Playwright's `expect` (waiting up to EXPECT_TIMEOUT_MS for what it checks), or skip the calling test module
    when Playwright or Chromium is missing (an error under STEADYFRAME_REQUIRE_BROWSER=1, as in CI)."""
    from tests.server_helpers import CHROMIUM, REQUIRE_BROWSER

    try:
        from playwright.sync_api import expect
    except ImportError:  # pragma: no cover - depends on the environment
        expect = None
    if expect is None or not CHROMIUM.exists():
        missing = "the playwright package" if expect is None else str(CHROMIUM)
        if REQUIRE_BROWSER:
            raise RuntimeError(f"STEADYFRAME_REQUIRE_BROWSER is set but {missing} is missing "
                               "(apt-get install chromium; bash scripts/install.sh --dev)")
        pytest.skip(f"{missing} is not installed (set STEADYFRAME_REQUIRE_BROWSER=1 to make this an error)",
                    allow_module_level=True)
    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    return expect
