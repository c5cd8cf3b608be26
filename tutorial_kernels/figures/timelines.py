"""Drawing SM timelines (`tutorial_kernels.recorder.Timeline`): where and when each program of a
launch ran, one lane per SM, coloured by wave; shared by chapters 1, 4 and 5.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tutorial_kernels.figures.style import WAVE_COLOURS, measured_layout, style_figure


def timeline_figure(run, *, title: str | None = None, fig: go.Figure | None = None, row: int | None = None,
                    col: int | None = None, showlegend: bool = True) -> go.Figure:
    """One lane per SM, one bar per program from its start to its end, coloured by wave.

    Programs that ran at the same time on one SM share its lane side by side (each gets a sub-lane);
    a program's wave is how many programs ran before it in its sub-lane, plus one. `run` is a
    `tutorial_kernels.recorder.Timeline` or its dict. Pass `fig`, `row`, `col` to draw into a subplot.
    """
    from tutorial_kernels.recorder import Timeline

    run = run if isinstance(run, Timeline) else Timeline.from_dict(run)
    lanes, waves = run.lanes(), run.waves()
    per_sm = max(lanes) + 1
    own = fig is None
    fig = fig or go.Figure()
    where = {} if row is None else dict(row=row, col=col)
    for w in sorted(set(waves)):
        ps = [p for p in range(run.n_programs) if waves[p] == w]
        fig.add_trace(go.Bar(
            orientation="h", base=[run.start_ns[p] / 1e3 for p in ps],
            x=[(run.end_ns[p] - run.start_ns[p]) / 1e3 for p in ps],
            y=[run.sm[p] - 0.5 + (lanes[p] + 0.5) / per_sm for p in ps], width=0.9 / per_sm,
            marker=dict(color=WAVE_COLOURS[(w - 1) % len(WAVE_COLOURS)], line=dict(width=0)),
            name=f"wave {w}", legendgroup=f"wave {w}", showlegend=showlegend,
            customdata=[[p, run.sm[p], run.start_ns[p] / 1e3, run.end_ns[p] / 1e3] for p in ps],
            hovertemplate="program %{customdata[0]} on SM %{customdata[1]}, wave " + str(w) + "<br>"
                          "%{customdata[2]:.1f} → %{customdata[3]:.1f} µs<extra></extra>",
        ), **where)
    fig.update_yaxes(range=[run.sm_count - 0.5, -0.5], title="SM", showgrid=False, zeroline=False, **where)
    fig.update_xaxes(title="µs since the first program started", rangemode="tozero", **where)
    if own:
        fig.update_layout(barmode="overlay", bargap=0)
        style_figure(fig, title or run.label, height=520)
    return fig


def stacked_timelines(data: dict, titles: list[str], heading: str) -> go.Figure:
    """The runs of a timeline file one above the other, each on its own time axis; the legend comes
    from the run with the most waves, so that it names every colour."""
    from tutorial_kernels.recorder import Timeline

    runs = [Timeline.from_dict(r) for r in data["timelines"]]
    fig = make_subplots(rows=len(runs), cols=1, subplot_titles=titles, vertical_spacing=0.14)
    most_waves = max(range(len(runs)), key=lambda i: max(runs[i].waves()))
    for i, run in enumerate(runs):
        timeline_figure(run, fig=fig, row=i + 1, col=1, showlegend=i == most_waves)
    fig.update_layout(barmode="overlay", bargap=0)
    return measured_layout(fig, data, heading, height=900)
