"""Issue 44 item 7: the page's text is readable and the keyboard's place visible, measured on the computed colors in
Chromium (1280×780): every help line under a label, the sliders' ends and the muted lines have a contrast of at
least 4.5:1 with what is behind them (WCAG AA; before: rgb(187,187,194) on white, 1.9:1), Start and End's labels
too (Start was 2.8:1), and a button reached with Tab shows a focus ring of at least 2 px at 3:1 or more against the
page (Start's was a white outline on white)."""
from __future__ import annotations

import pytest

from tests.browser_helpers import chromium, require_browser

pytestmark = pytest.mark.slow
LAPTOP = {"width": 1280, "height": 780}

expect = require_browser()

# the WCAG contrast of an element's text against the first opaque background behind it (computed colors)
CONTRASTS_JS = """(selectors) => {
  const rgb = s => (s.match(/[\\d.]+/g) || []).map(Number);
  const lum = c => { const [r, g, b] = c.slice(0, 3).map(v => { v /= 255;
      return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); }); return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  const ratio = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
  const behind = e => { for (let n = e; n; n = n.parentElement) { const c = rgb(getComputedStyle(n).backgroundColor);
      if (c.length === 3 || (c.length === 4 && c[3] > 0.9)) return c; } return [255, 255, 255]; };
  return selectors.flatMap(sel => [...document.querySelectorAll(sel)].filter(e => e.offsetParent !== null
      && e.innerText.trim()).map(e => [sel, e.innerText.trim().slice(0, 40),
      ratio(rgb(getComputedStyle(e).color), behind(e))]));
}"""


@pytest.fixture(scope="module")
def browser():
    yield from chromium()


@pytest.fixture(scope="module")
def page(server, browser):
    page = browser.new_page(viewport=LAPTOP)
    page.goto(server.url)
    page.wait_for_selector("#start-btn")
    yield page
    page.close()


def test_help_text_and_buttons_have_a_contrast_of_at_least_4_5(page):
    measured = page.evaluate(CONTRASTS_JS, [".info-text", ".min_value", ".max_value", "#prompt-tokens",
                                            "#start-btn", "label span", "#queue-status"])
    helps = [m for m in measured if m[0] == ".info-text"]
    assert len(helps) >= 5, measured                     # the help lines are there and were measured
    assert any(m[0] == "#start-btn" for m in measured), measured
    low = [(sel, text, round(r, 2)) for sel, text, r in measured if r < 4.5]
    assert not low, low


def test_a_button_reached_with_tab_shows_a_focus_ring(page):
    page.locator("#prompt textarea").focus()
    for _ in range(40):                                  # Tab on until Start has the focus
        page.keyboard.press("Tab")
        if page.evaluate("() => document.activeElement?.id === 'start-btn'"):
            break
    assert page.evaluate("() => document.activeElement?.id") == "start-btn"
    style = page.evaluate("""() => { const cs = getComputedStyle(document.activeElement);
        return [cs.outlineStyle, parseFloat(cs.outlineWidth), cs.outlineColor]; }""")
    assert style[0] not in ("none", "auto") and style[1] >= 2, style
    ratio = page.evaluate(CONTRASTS_JS.replace("getComputedStyle(e).color", "getComputedStyle(e).outlineColor")
                          .replace("behind(e)", "[255, 255, 255]"), ["#start-btn"])
    assert ratio and ratio[0][2] >= 3, (style, ratio)
