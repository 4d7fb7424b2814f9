"""Show labkit's figures inline in Jupyter without pyplot.

Introduced in notebooks/02_collectives.ipynb.

Every ``lk.viz`` function returns a ``matplotlib.figure.Figure`` built without pyplot, so a
figure returned as a cell's last expression is shown once and never again by pyplot's
end-of-cell flush. IPython only renders such a figure as an image when a display formatter
for ``Figure`` is registered; the inline backend registers one, but only once pyplot is
activated (``%matplotlib inline``). Importing ``labkit.viz`` registers a PNG formatter the
same way IPython's ``pylabtools.select_figure_formats`` does, unless one already exists.
"""

from __future__ import annotations

import sys
from functools import partial
from typing import Any


def enable_inline_figures(shell: Any = None) -> bool:
    """Let an IPython kernel display a returned ``Figure`` as a PNG, without pyplot.

    Args:
        shell: the IPython shell (default: the running one, if any).

    Returns:
        True when ``Figure`` objects now display as images (a formatter was registered, or
        the user's own, e.g. ``%config InlineBackend.figure_formats = ["svg"]``, was kept);
        False outside IPython.

    Raises:
        Nothing; outside IPython it does nothing.
    """
    if shell is None:
        ipython = sys.modules.get("IPython")  # a running kernel has imported it already
        if ipython is None:
            return False
        shell = ipython.get_ipython()
    formatters = getattr(getattr(shell, "display_formatter", None), "formatters", None)
    if not formatters or "image/png" not in formatters:
        return False
    from matplotlib.figure import Figure

    for formatter in formatters.values():
        try:
            formatter.lookup_by_type(Figure)
        except KeyError:
            continue
        return True  # already configured (inline backend or the user): keep it
    from IPython.core.pylabtools import print_figure

    formatters["image/png"].for_type(Figure, partial(print_figure, fmt="png", base64=True))
    return True
