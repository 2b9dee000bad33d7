"""The built site, opened in a real browser: headless Chromium (the system's, e.g. Debian's
`chromium` package) driven by Playwright's Python package, every page from file://.

Needs the site built by the README's docs command (docs/_build/html), the `docs` extra
(playwright) and a Chromium binary (RPG_CHROMIUM=PATH picks one). When one of them is missing the
module skips with one line saying which; RPG_SITE_TESTS=1 (CI) makes that a failure instead.

Every request that leaves file:// is aborted and counted as a failure: the site must work offline.
"""

from __future__ import annotations

import io
import math
import os
import re
import shutil
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "docs" / "_build" / "html"
BUILD_HINT = "build it with the README's docs command (the line after <!-- docs-command -->)"
CHROMIUM_CANDIDATES = ("/usr/lib/chromium/chromium-headless-shell", "/usr/lib/chromium/chromium",
                       shutil.which("chromium") or "", shutil.which("chromium-browser") or "")
# the theme's own script logs this once per page when no light/dark mode was stored yet
ALLOWED_CONSOLE_ERRORS = (re.compile(r"Got invalid theme mode"),)


def _chromium() -> str | None:
    candidates = (os.environ["RPG_CHROMIUM"],) if os.environ.get("RPG_CHROMIUM") else \
        CHROMIUM_CANDIDATES
    return next((p for p in candidates if p and os.access(p, os.X_OK)), None)


def _why_not() -> str | None:
    if not (SITE / "docs" / "index.html").is_file():
        return f"site not built at docs/_build/html: {BUILD_HINT}"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright not installed: pip install -e '.[docs]'"
    if _chromium() is None:
        return ("no Chromium found: apt-get install chromium (Debian), or set "
                "RPG_CHROMIUM to an executable Chromium")
    return None


_missing = _why_not()
if _missing and os.environ.get("RPG_SITE_TESTS") == "1":
    pytest.fail(f"RPG_SITE_TESTS=1 but {_missing}", pytrace=False)
if _missing:
    pytest.skip(_missing, allow_module_level=True)

import torch
from playwright.sync_api import sync_playwright

from rpg_ref.core.losses import get_loss

PAGES = sorted(p for p in SITE.rglob("*.html") if "_static" not in p.parts)
DESKTOP, PHONE = {"width": 1280, "height": 900}, {"width": 390, "height": 844}
# what a page shows when its math was not typeset (text outside code blocks)
RAW_TEX = re.compile(r"\\[()\[\]]|\$\$|\\(frac|hat|pi|theta|beta|mathrm|nabla|log|left|right|"
                     r"begin|epsilon|sum|mathbb|operatorname)\b")


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=_chromium())
        yield b
        b.close()


class Visit:
    """One page opened in a fresh context: what went wrong while it loaded."""

    def __init__(self, browser, path: Path, viewport=DESKTOP, query: str = ""):
        self.outside, self.failed, self.errors = [], [], []
        self.context = browser.new_context(viewport=viewport)
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.page.on("requestfailed", lambda r: self.failed.append(f"{r.url} ({r.failure})"))
        self.page.goto(path.as_uri() + query, wait_until="load")
        # math is typeset asynchronously: wait for MathJax where the page loads it
        self.page.wait_for_function(
            "() => !window.MathJax || (window.MathJax.startup && window.MathJax.startup.promise)")
        self.page.evaluate("() => window.MathJax ? window.MathJax.startup.promise : null")

    def _route(self, route):
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            self.outside.append(route.request.url)
            route.abort()

    def _console(self, msg):
        if msg.type == "error" and not any(p.search(msg.text) for p in ALLOWED_CONSOLE_ERRORS):
            self.errors.append(f"console: {msg.text}")

    def close(self):
        self.context.close()


@pytest.fixture(scope="module")
def crawl(browser):
    """Every page of the site opened once: {relative path: findings}."""
    found = {}
    for path in PAGES:
        v = Visit(browser, path)
        p = v.page
        found[path.relative_to(SITE).as_posix()] = {
            "outside": v.outside, "failed": v.failed, "errors": v.errors,
            "links": p.eval_on_selector_all("a[href]", "els => els.map(a => a.href)"),
            "broken_images": p.eval_on_selector_all(
                "img", "els => els.filter(i => !i.complete || i.naturalWidth === 0)"
                       ".map(i => i.src)"),
            "math": p.eval_on_selector_all(
                ".math", "els => [els.length, els.filter(e => !e.querySelector("
                         "'mjx-container')).map(e => e.textContent.slice(0, 80))]"),
            "text": p.evaluate("""() => {
                const body = document.body.cloneNode(true);
                body.querySelectorAll('pre, code, script, style, mjx-container, .highlight')
                    .forEach(e => e.remove());
                return body.innerText; }"""),
        }
        v.close()
    return found


def test_the_site_has_its_pages():
    names = {p.relative_to(SITE).as_posix() for p in PAGES}
    for page in ("docs/index.html", "docs/start_here.html", "docs/learn/index.html",
                 "docs/design_space.html", "docs/clip_shapes.html",
                 "docs/reference/losses.html", "small_scale/RESULTS.html", "search.html"):
        assert page in names, f"{page} missing from the site"
    notebooks = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert notebooks and all(f"notebooks/{n}.html" in names for n in notebooks)


def test_every_page_opens_without_console_errors(crawl):
    bad = {page: f["errors"] for page, f in crawl.items() if f["errors"]}
    assert not bad, bad


def test_no_request_leaves_the_site(crawl):
    """A CDN font, script or image would be missing offline."""
    bad = {page: f["outside"] for page, f in crawl.items() if f["outside"]}
    assert not bad, bad


def test_no_request_fails(crawl):
    bad = {page: f["failed"] for page, f in crawl.items() if f["failed"]}
    assert not bad, bad


def _ids(path: Path, cache={}) -> set[str]:  # noqa: B006 (a cache on purpose)
    if path not in cache:
        cache[path] = set(re.findall(r'\bid="([^"]+)"', path.read_text(encoding="utf-8")))
    return cache[path]


def test_no_broken_internal_link(crawl):
    """Every file:// link points to a file of the site, and its #fragment to an id there."""
    bad = []
    for page, f in crawl.items():
        for href in f["links"]:
            url = urlsplit(href)
            if url.scheme != "file":
                continue
            target = Path(unquote(url.path))
            if not target.is_file() or SITE not in target.parents:
                bad.append(f"{page}: {href} (no such file in the site)")
            elif url.fragment and target.suffix == ".html" \
                    and unquote(url.fragment) not in _ids(target):
                bad.append(f"{page}: {href} (no id {url.fragment!r} there)")
    assert not bad, "\n".join(bad)


def test_no_broken_image(crawl):
    bad = {page: f["broken_images"] for page, f in crawl.items() if f["broken_images"]}
    assert not bad, bad


def test_math_is_rendered(crawl):
    """Every math element was typeset by MathJax, and no TeX source is left in the text."""
    assert crawl["docs/clip_shapes.html"]["math"][0] > 10     # the check has math to look at
    untypeset = {page: f["math"][1] for page, f in crawl.items() if f["math"][1]}
    assert not untypeset, untypeset
    raw = {page: sorted(set(RAW_TEX.findall(f["text"]))) for page, f in crawl.items()
           if RAW_TEX.search(f["text"])}
    assert not raw, raw


def _stored_figures(notebook: Path) -> int:
    import json
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return sum(1 for c in cells for o in c.get("outputs", [])
               if any(k.startswith("image/") for k in o.get("data", {})))


def test_notebook_figures_are_visible(browser):
    """Each notebook page shows as many figures as its .ipynb stores, each drawn at a real size."""
    checked = 0
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        want = _stored_figures(nb)
        v = Visit(browser, SITE / "notebooks" / f"{nb.stem}.html")
        sizes = v.page.eval_on_selector_all(
            ".cell_output img", "els => els.map(i => { i.scrollIntoView(); "
            "const r = i.getBoundingClientRect(); return [i.naturalWidth, r.width, r.height, "
            "getComputedStyle(i).visibility]; })")
        v.close()
        assert len(sizes) == want, f"{nb.name}: {len(sizes)} figures on the page, {want} stored"
        for natural, width, height, visibility in sizes:
            assert natural > 0 and width > 100 and height > 50 and visibility == "visible", \
                f"{nb.name}: a figure is not visible ({natural}, {width}x{height}, {visibility})"
        checked += want
    assert checked > 0


def test_search_finds_the_urkl_loss(browser):
    """The site's search (its own index, no server) finds the URKL losses' reference entries
    and the losses page."""
    v = Visit(browser, SITE / "search.html", query="?q=URKL")
    v.page.wait_for_function("() => (document.querySelector('#search-results p.search-summary')"
                             " || {}).textContent?.includes('Search finished')", timeout=30000)
    hits = [urlsplit(h) for h in v.page.eval_on_selector_all(
        "#search-results ul.search li a", "els => els.map(a => a.href)")]
    errors = v.errors + v.outside + v.failed
    v.close()
    assert not errors, errors
    found = {(h.path.split("/html/", 1)[-1], h.fragment) for h in hits}
    assert ("docs/reference/losses.html", "rpg_ref.core.losses.rpg_urkl") in found, found
    assert ("docs/reference/losses.html", "rpg_ref.core.losses.rpg_reinforce_urkl") in found
    assert ("docs/losses.html", "") in found, found


# ---------------------------------------------------------------- the interactive clip page

CURVE_LOSSES = {"ppo": lambda kl: "dapo", "alg1": lambda kl: f"rpg-{kl}",
                "alg2": lambda kl: f"rpg-reinforce-{kl}"}


def _package_point(name: str, w: float, A: float, beta: float, clip) -> tuple[float, float]:
    """One unit (B = T = 1) with ell = -log pi_theta = 1, pi_ref = pi_old and ratio w: the loss
    and d loss / d log pi_theta, from rpg_ref.core.losses in float64."""
    logp = torch.full((1, 1), -1.0, dtype=torch.float64, requires_grad=True)
    old = torch.full((1, 1), -1.0 - math.log(w), dtype=torch.float64)
    loss, _ = get_loss(name)(logp, old, torch.tensor([A], dtype=torch.float64),
                             torch.ones(1, 1, dtype=torch.float64), beta=beta, clip=clip)
    (g,) = torch.autograd.grad(loss, logp)
    return loss.item(), g.item()


def _check_against_package(data: dict, params: dict, stride: int = 4) -> None:
    """Every stride-th drawn point (60 of 240: one call of the loss per point and curve)."""
    points = range(0, len(data["w"]), stride)
    w = [data["w"][i] for i in points]
    assert len(w) >= 50
    kl, beta, c = params["kl"], params["beta"], params["c"]
    for key, name_of in CURVE_LOSSES.items():
        curve = data["curves"][key]
        name = name_of(kl)
        assert curve["name"] == name
        ppo = key == "ppo"
        clip = (params["eps_low"], params["eps_high"], None if ppo else c)
        for A in (1, -1):
            page = {k: [curve[str(A)][k][i] for i in points] for k in ("loss", "grad")}
            ref = [_package_point(name, wi, A, 0.0 if ppo else beta, clip) for wi in w]
            for i, (wi, (loss, grad)) in enumerate(zip(w, ref)):
                assert page["loss"][i] == pytest.approx(loss, rel=1e-12, abs=1e-12), \
                    f"{key} A={A} w={wi}: loss {page['loss'][i]} on the page, {loss} in rpg_ref"
                assert page["grad"][i] == pytest.approx(grad, rel=1e-12, abs=1e-12), \
                    f"{key} A={A} w={wi}: gradient {page['grad'][i]} on the page, {grad} in rpg_ref"
            # a clip binds in the drawn range (Algorithm 1's clipped segments keep a gradient
            # through A_hat when beta > 0), so the comparison covers clipped and unclipped points
            if key != "alg1" or beta == 0:
                assert 0.0 in page["grad"] and any(g != 0.0 for g in page["grad"]), (key, A)


SLIDER_SETTINGS = [
    {"eps_low": "0.1", "eps_high": "0.1", "dual": True, "c": "1.5", "beta": "0.5", "kl": "rkl"},
    {"eps_low": "0.3", "eps_high": "0.6", "dual": True, "c": "2.2", "beta": "0.3", "kl": "fkl"},
    {"eps_low": "0.5", "eps_high": "1.5", "dual": False, "c": "3", "beta": "0.4", "kl": "ufkl"},
    {"eps_low": "0.2", "eps_high": "0.28", "dual": True, "c": "10", "beta": "0", "kl": "urkl"},
]


@pytest.fixture
def clip_page(browser):
    v = Visit(browser, SITE / "docs" / "clip_shapes.html")
    yield v
    assert not (v.errors or v.outside or v.failed), (v.errors, v.outside, v.failed)
    v.close()


def _set(page, setting: dict) -> None:
    for name in ("eps_low", "eps_high", "c", "beta"):
        page.fill(f"#clip-shapes input[name={name}]", setting[name])
    page.set_checked("#clip-shapes input[name=dual]", setting["dual"])
    page.select_option("#clip-shapes select[name=kl]", setting["kl"])


def test_clip_page_curves_are_the_packages(clip_page):
    """The page's curves, at every drawn point, for its default and for settings chosen with the
    sliders, equal rpg_ref.core.losses (loss and autograd gradient, float64, 1e-12)."""
    page = clip_page.page
    default = page.evaluate("rpgClipShapes.params()")
    assert default == {"eps_low": 0.2, "eps_high": 0.28, "c": 3, "beta": 0.1, "kl": "urkl"}
    _check_against_package(page.evaluate("rpgClipShapes.current()"), default)
    for setting in SLIDER_SETTINGS:
        _set(page, setting)
        params = page.evaluate("rpgClipShapes.params()")
        assert params == {"eps_low": float(setting["eps_low"]),
                          "eps_high": float(setting["eps_high"]),
                          "c": float(setting["c"]) if setting["dual"] else None,
                          "beta": float(setting["beta"]), "kl": setting["kl"]}
        _check_against_package(page.evaluate("rpgClipShapes.current()"), params)


def test_moving_a_slider_changes_the_curve(clip_page):
    page = clip_page.page
    path = "#clip-shapes svg[data-panel='loss:1'] path[data-curve=ppo][data-flat=true]"
    before = page.get_attribute(path, "d")
    ppo_before = page.evaluate("rpgClipShapes.current().curves.ppo['1'].loss")
    page.fill("#clip-shapes input[name=eps_high]", "0.8")
    assert page.get_attribute(path, "d") != before
    ppo_after = page.evaluate("rpgClipShapes.current().curves.ppo['1'].loss")
    assert ppo_after != ppo_before
    assert page.text_content("#clip-shapes output[data-for=eps_high]") == "0.8"


# ---------------------------------------------------------------- how pages look

def _not_blank(png: bytes) -> tuple[float, int]:
    """(share of pixels that differ from the most common colour, number of distinct colours)."""
    from PIL import Image
    img = Image.open(io.BytesIO(png)).convert("RGB")
    colors = img.getcolors(maxcolors=1 << 24)
    top = max(n for n, _ in colors)
    return 1.0 - top / (img.width * img.height), len(colors)


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
@pytest.mark.parametrize("page", ["docs/index.html", "docs/clip_shapes.html",
                                  "notebooks/04_rpg_style_clip.html"])
def test_screenshot_is_not_blank(browser, page, viewport):
    v = Visit(browser, SITE / page, viewport=viewport)
    png = v.page.screenshot(full_page=False)
    width = v.page.evaluate("document.documentElement.scrollWidth")
    v.close()
    inked, n_colors = _not_blank(png)
    assert inked > 0.02 and n_colors > 50, f"{page} at {viewport}: {inked:.3f} inked, " \
                                           f"{n_colors} colours"
    assert width <= viewport["width"], f"{page} scrolls sideways at {viewport}: {width} px"
