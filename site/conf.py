"""Sphinx configuration of the course book (`make site`; gpumem.course.site copies this file into
the generated source folder next to the executed notebooks and builds it).

Everything a page loads comes from the book's own folder, so it reads offline: no MathJax (the
notebooks hold no formulas, and "dollarmath" is off; Sphinx adds MathJax, from a CDN, only to a
page with a formula, and the build's network check would then fail), no widget
JavaScript from unpkg (nb_ipywidgets_js is empty; the pages hold no live widgets), no launch,
repository or download buttons, no analytics. Search is Sphinx's own: an index (searchindex.js)
read by JavaScript in the page, with nothing asked of a server.
"""

project = "Fitting 70B"
author = "the Fitting 70B course"
copyright = "the Fitting 70B course"

extensions = ["myst_nb"]
nb_execution_mode = "off"            # the stored outputs are the book; nothing is re-run
nb_ipywidgets_js = {}                # no require.js / @jupyter-widgets from a CDN
nb_merge_streams = True
myst_heading_anchors = 3             # ## headings get ids a link can point at
myst_enable_extensions = ["colon_fence", "html_image"]
suppress_warnings = ["mystnb.unknown_mime_type", "myst.header", "misc.highlighting_failure"]
exclude_patterns = ["_build", "**.ipynb_checkpoints"]

html_theme = "sphinx_book_theme"
html_title = "Fitting 70B"
html_static_path = ["_static"]
html_css_files = ["jupyterquiz.css", "gpumem.css"]
html_copy_source = False
html_show_sourcelink = False
html_last_updated_fmt = None
html_search_language = "en"
html_theme_options = {
    "home_page_in_toc": True,
    "show_toc_level": 2,
    "show_navbar_depth": 1,
    "use_download_button": False,
    "use_fullscreen_button": False,
    "use_repository_button": False,
    "use_issues_button": False,
    "use_edit_page_button": False,
    "use_source_button": False,
    "launch_buttons": {},
    "icon_links": [],
    "navigation_with_keys": False,
    "show_prev_next": True,
    "search_bar_text": "Search the course…",
}
html_show_search_summary = False     # summaries would fetch each page (refused over file://)
