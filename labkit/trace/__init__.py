"""Per-rank spans → one timeline → Chrome-trace JSON (opens in Perfetto) and figures.

Introduced in notebooks/04_custom_backend.ipynb.

Inside each rank (a function run by ``lk.launch``)::

    with lk.trace.span("forward", kind="compute"):
        loss = model(x).sum()
    ...
    return lk.trace.events()  # compute spans + the ops the recording backend saw

In the notebook::

    timeline = lk.trace.Timeline.merge(per_rank_events)
    timeline.to_chrome_trace("step.json")  # open at https://ui.perfetto.dev
    lk.viz.timeline(timeline)

``lk.trace.trace_modules(model)`` records each layer's forward and backward as spans.
Communication spans come from ``labkit.backends.recording`` (launch with
``backend="labkit_record"`` or ``lk.backends.recording.spec(...)``). Imports no torch.
"""

from __future__ import annotations

from labkit.trace.chrome import check_chrome_trace, to_chrome_trace
from labkit.trace.modules import ModuleTracer, trace_modules
from labkit.trace.spans import COMM, COMPUTE, Span, clock_ns, events, reset, span, sync_device
from labkit.trace.timeline import RankSummary, Timeline

__all__ = [
    "COMM",
    "COMPUTE",
    "ModuleTracer",
    "RankSummary",
    "Span",
    "Timeline",
    "check_chrome_trace",
    "clock_ns",
    "events",
    "reset",
    "span",
    "sync_device",
    "to_chrome_trace",
    "trace_modules",
]
