"""Sphinx configuration of the rpg-ref site (the README's docs command builds it).

The source folder is the repository root, limited to the files below, so that every relative
link between docs/, the notebooks, small_scale/RESULTS.md and derivations/ resolves on the site
exactly as it does in the repository. Notebooks render from their stored outputs (never executed
here); math is typeset by a MathJax copy served with the site (no CDN: readers may be offline).
"""

from __future__ import annotations

project = "rpg-ref"
author = "rpg-ref contributors"
copyright = "rpg-ref contributors, Apache-2.0"

root_doc = "docs/index"
include_patterns = [
    "README.md",
    "docs/**.md",
    "notebooks/*.ipynb",
    "notebooks/README.md",
    "small_scale/RESULTS.md",
    "small_scale/README.md",
    "derivations/README.md",
    "derivations/ERRATA.md",
]
exclude_patterns = ["docs/_build", "docs/_static", "docs/_extra", "**/.ipynb_checkpoints",
                    ".*", "**/.*", "build", "dist", "runs"]

extensions = [
    "myst_nb",                  # MyST markdown and notebooks (includes myst_parser)
    "sphinx.ext.autodoc",       # the loss reference, from rpg_ref.core.losses's docstrings
    "sphinx-mathjax-offline",   # MathJax 3 with its fonts, copied into the site
    "sphinx_design",            # dropdowns (exercise solutions), tabs, cards
]

# --- MyST and notebooks ---
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 4        # [text](page.md#a-heading) links, as GitHub writes them
nb_execution_mode = "off"       # render the outputs stored in each .ipynb; execute nothing
nb_merge_streams = True

# --- autodoc: docstrings are plain text with aligned formulas; show them as written ---
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "ignore-module-all": True}


def _docstring_as_written(app, what, name, obj, options, lines):
    """The docstrings are written to be read in a terminal (aligned formulas, no markup):
    render each as a plain-text block so that layout survives and no docstring can break -W.
    A registered loss formula is headed by the names it is registered under."""
    from rpg_ref.core.losses import LOSSES
    text = [line.rstrip() for line in lines]
    while text and not text[-1]:
        text.pop()
    head = [f"Registered as ``LOSSES[{n!r}]``." for n, loss in LOSSES.items()
            if loss.formula is obj]
    block = [".. code-block:: text", ""] + ["    " + line if line else "" for line in text]
    lines[:] = (head + [""] if head else []) + (block + [""] if text else [])


# --- HTML ---
html_theme = "sphinx_book_theme"
html_title = "rpg-ref"
html_static_path = ["_static"]
html_css_files = ["site.css"]
html_extra_path = ["_extra"]    # index.html at the top of the site: a link to docs/index.html
html_copy_source = False        # no _sources/ (search summaries come from the index only)
html_show_sourcelink = False
html_show_search_summary = False  # summaries fetch pages, which a file:// site cannot
html_theme_options = {
    "show_toc_level": 2,
    "use_download_button": False,
    "use_fullscreen_button": False,
}
html_last_updated_fmt = None

INTERACTIVE_PAGES = {"docs/clip_shapes": "clip_shapes.js"}


def _page_scripts(app, pagename, templatename, context, doctree):
    if pagename in INTERACTIVE_PAGES:
        app.add_js_file(INTERACTIVE_PAGES[pagename])


def setup(app):
    app.connect("autodoc-process-docstring", _docstring_as_written)
    app.connect("html-page-context", _page_scripts)

