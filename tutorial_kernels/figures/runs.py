"""Where and how a data file was measured, as the figures say it.

Every figure of measurements carries one short line under its title (`short_line`: the GPU) and,
in a collapsed caption under the figure, the full record (`run_lines`: GPU, versions,
date, commit, how it was timed, the command). A data file's "provenance" describes the run that wrote
it; a file that later runs extended (`bench --append`, `measure_hbm_bytes.py --merge`) keeps the
earlier runs' under "earlier_runs".

Commands are recorded as they were typed, and scripts have moved since: the one-off probes from
`tools/` to `experiments/DATE_NAME/`, the recorders into `tutorial_kernels.instruments` and
`tutorial_kernels.integrations`. `current_command` writes a recorded command with today's paths, so
that no figure names a file that is not in the tree (a script that is gone entirely is named with the
commit that had it, for `git show`).
"""

from __future__ import annotations

import html
import re

from tutorial_kernels.paths import repository_root

# `python -m` targets as recorded → their module in today's tree
MOVED_MODULES = {
    "tutorial_kernels.timeline": "tutorial_kernels.instruments.timeline",
    "tutorial_kernels.gpt": "tutorial_kernels.integrations.gpt",
    "tutorial_kernels.prefill": "tutorial_kernels.integrations.prefill",
}
# recorded commands whose subcommand became a module of its own
MOVED_COMMANDS = {
    # the ROCm blog's sweep, named after where the experiment comes from
    "python -m tutorial_kernels.bench ch02-seed --out data/ch02_seed.json":
        "python -m tutorial_kernels.bench ch02-rocm --out data/ch02_rocm.json",
    "python -m tutorial_kernels.ch04_flash_v1 tiles": "python -m tutorial_kernels.instruments.tile_sweep",
    "python -m tutorial_kernels.ch04_flash_v1 timeline": "python -m tutorial_kernels.instruments.timeline ch04-timeline",
}
SCRIPT = re.compile(r"(?<![\w/.])tools/(?P<name>[\w-]+\.py)")


def file_runs(data: dict) -> list[dict]:
    """The provenance of every run whose rows `data` holds: the newest first, then the earlier ones."""
    return [data["provenance"], *(e["provenance"] for e in data.get("earlier_runs", []))]


def gpu_name(p: dict) -> str:
    """'NVIDIA H100 80GB HBM3' → 'H100 80GB HBM3'."""
    return p.get("gpu", "unknown GPU").removeprefix("NVIDIA ")


def short_commit(p: dict) -> str:
    return p.get("git_commit", "?")[:7]


def short_line(runs: list[dict]) -> str:
    """One line for under a figure's title: the GPU that measured it ('H100 80GB HBM3'), each distinct
    GPU for several runs. Dates, commits and commands are the record, in the caption ("How this was
    measured"), not the figure's subtitle."""
    return " and ".join(dict.fromkeys(gpu_name(p) for p in runs))


def current_command(command: str, commit: str = "") -> str:
    """`command` as it runs in today's tree: moved modules and scripts under their new paths, an `--out`
    into a machine's folder left out (the default writes the data file); a script that is no longer
    anywhere is named with the commit that ran it. Unchanged outside a checkout."""
    root = repository_root()
    if root is None:
        return command
    for old, new in MOVED_COMMANDS.items():
        if command == old or command.startswith(old + " "):
            command = new + command[len(old):]
    for old, new in MOVED_MODULES.items():
        command = re.sub(rf"(-m\s+){re.escape(old)}(?![\w.])", rf"\g<1>{new}", command)

    # `--out` into a machine's folder (the device's output directory): the default, under data/, is where
    # the committed file lives, so the command a reader reruns leaves it out
    command = re.sub(r"\s--out\s+/\S+", "", command)
    removed = []

    def script(m: re.Match) -> str:
        if (root / "tools" / m["name"]).exists():
            return m[0]
        moved = sorted(root.glob(f"experiments/*/{m['name']}"))
        if moved:
            return moved[0].relative_to(root).as_posix()
        removed.append(m[0])
        return m[0]

    command = SCRIPT.sub(script, command)
    for path in removed:  # as a shell comment after the command
        command += f"  # {path} was removed after this run: git show {commit or 'COMMIT'}:{path}"
    return command


def run_lines(p: dict, label: str = "") -> str:
    """The full record of one run, as HTML: GPU and versions, date and commit, how it was timed, and
    the command (with today's paths)."""
    versions = [gpu_name(p)]
    versions += [f"{name} {p[key]}" for key, name in (("torch", "torch"), ("triton", "triton"), ("cuda", "CUDA"),
                                                      ("transformers", "transformers")) if p.get(key)]
    if p.get("ncu"):
        versions.append("Nsight Compute " + p["ncu"].replace("Version ", "").split(" ")[0])
    when = f"{p.get('date_utc', '')[:16].replace('T', ' ')} UTC · commit {short_commit(p)}"
    lines = [f"{f'<b>{html.escape(label)}</b>: ' if label else ''}{html.escape(' · '.join(versions))} · {when}"]
    if p.get("timing"):
        lines.append(f"timing: {html.escape(p['timing'])}")
    if p.get("command"):
        lines.append(f"<code>{html.escape(current_command(p['command'], short_commit(p)))}</code>")
    return "<br>".join(lines)


def file_lines(data: dict, label: str = "") -> list[str]:
    """`run_lines` of each run whose rows `data` holds, the newest first."""
    runs = file_runs(data)
    out = [run_lines(runs[0], label)]
    for p in runs[1:]:
        out.append(run_lines(p, f"{label + ': ' if label else ''}rows kept from an earlier run"))
    return out


def provenance_line(data: dict) -> str:
    """Where and how `data` was measured, as one HTML line per run: GPU, versions, date, commit, command
    (kept for the notebooks, which print it)."""
    out = []
    for i, p in enumerate(file_runs(data)):
        versions = " · ".join(f"{name} {p[key]}" for key, name in (("torch", "torch"), ("triton", "triton"), ("cuda", "CUDA"))
                              if p.get(key))
        head = f"{p.get('gpu', '')} · {versions}<br>" if i == 0 else "and rows of "
        out.append(f"{head}{p.get('date_utc', '')[:10]} · commit {short_commit(p)} · "
                   f"<i>{html.escape(current_command(p.get('command', ''), short_commit(p)).split(' --out')[0])}</i>")
    return "<br>".join(out)
