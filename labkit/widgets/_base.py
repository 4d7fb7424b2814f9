"""What every explorer shares: a headless state, a lazily built ipywidgets container.

Introduced in notebooks/03_allreduce_algorithms.ipynb.

An explorer's callback is a plain method (``show``, ``update``) that computes its numbers with
labkit's real code, builds its figure with an ``lk.viz`` function and keeps both as
attributes, so tests call it without a browser. ``ui`` builds the ipywidgets controls on first
use (importing ipywidgets only then) and wires them to that method.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Explorer"]


class Explorer:
    """Base of the explorers: ``figure`` and ``text`` hold what the last callback produced."""

    def __init__(self) -> None:
        self.figure: Any = None
        self.text: str = ""
        self._ui: Any = None
        self._out: Any = None
        self._html: Any = None

    @property
    def ui(self) -> Any:
        """The ipywidgets container (controls, a text line, the figure), built on first use."""
        if self._ui is None:
            import ipywidgets as widgets

            self._out = widgets.Output()
            self._html = widgets.HTML()
            controls = self._controls(widgets)
            self._ui = widgets.VBox([*controls, self._html, self._out])
            self._redraw()
        return self._ui

    def widget(self) -> Any:
        """``ui`` with this explorer attached as its ``explorer`` attribute.

        Returns:
            The ipywidgets container, as the ``*_explorer`` functions return it.
        """
        box = self.ui
        box.explorer = self
        return box

    def _controls(self, widgets: Any) -> list[Any]:
        raise NotImplementedError

    def _redraw(self) -> None:
        """Show ``figure`` and ``text`` in the container (a no-op until ``ui`` exists)."""
        if self._out is None:
            return
        import html

        from IPython import get_ipython
        from IPython.display import display

        self._html.value = f"<pre>{html.escape(self.text)}</pre>"
        if get_ipython() is None:  # headless (tests): nothing to show the figure in
            return
        with self._out:
            self._out.clear_output(wait=True)
            if self.figure is not None:
                display(self.figure)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.ui)
