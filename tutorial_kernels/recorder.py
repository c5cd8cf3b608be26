"""Where did my programs run? Record, for every program of a Triton kernel, its SM and its start and end time.

A kernel opts in by taking a trace buffer and calling two device functions:

    @triton.jit
    def my_kernel(..., trace_ptr):
        start = recorder.program_start()        # %globaltimer, in ns, when the program begins
        ...                                     # the kernel's work
        recorder.program_end(trace_ptr, start)  # writes (SM id, start, end) to row `program id`

    buffer = recorder.new_trace(n_programs, device)   # (n_programs, 3) int64, poisoned with -1
    my_kernel[grid](..., buffer)
    run = recorder.Timeline.from_trace(buffer, "my label", sm_count=132, grid=grid)

`%smid` (the SM a thread runs on) and `%globaltimer` (a nanosecond clock shared by the whole GPU)
are PTX special registers, read with `tl.inline_asm_elementwise`. Triton's interpreter cannot run
inline assembly, so on a machine without a GPU `unavailable_reason()` says why and recording raises
`TimelineUnavailable`; the notebooks then show a trace recorded on an H100 from `data/`.

The experiments that record timelines on a GPU and write them to `data/` live in
`tutorial_kernels.instruments.timeline`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import triton
import triton.language as tl

from tutorial_kernels.runtime import interpreter_active

# --8<-- [start:special_registers]
@triton.jit
def sm_id():
    """The SM this program runs on (PTX %smid): the same for every thread of a program."""
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def global_time():
    """The GPU-wide nanosecond clock (PTX %globaltimer); is_pure=False so every call reads it again."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def program_start():
    return global_time()


@triton.jit
def program_end(trace_ptr, start):
    """Write (SM, start, end) to row p of trace, p = the program's linear id (axis 0 fastest, as CUDA)."""
    end = global_time()
    pid = tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + tl.num_programs(1) * tl.program_id(2))
    row = trace_ptr + pid.to(tl.int64) * 3
    tl.store(row, sm_id().to(tl.int64))
    tl.store(row + 1, start)
    tl.store(row + 2, end)
# --8<-- [end:special_registers]


class TimelineUnavailable(RuntimeError):
    """Recording needs a CUDA GPU: the interpreter cannot run the inline assembly."""


def unavailable_reason() -> str | None:
    """Why programs cannot be traced here, or None when they can."""
    if interpreter_active() or not torch.cuda.is_available():
        return ("recording where programs run needs a CUDA GPU: it reads the PTX registers %smid and "
                "%globaltimer with inline assembly, which Triton's interpreter cannot execute")
    return None


def require_recording() -> None:
    if (reason := unavailable_reason()) is not None:
        raise TimelineUnavailable(reason)


def check_trace(trace: object, n_programs: int, device: torch.device) -> None:
    """Raise unless `trace` is what `new_trace(n_programs)` makes on `device` (every program writes its
    row: a smaller buffer would be written past its end), or recording cannot run here."""
    require_recording()
    if not (isinstance(trace, torch.Tensor) and trace.dtype == torch.int64 and trace.device == device
            and trace.is_contiguous() and tuple(trace.shape) == (n_programs, 3)):
        got = (f"{type(trace).__name__} {tuple(trace.shape)} {trace.dtype} on {trace.device}"
               if isinstance(trace, torch.Tensor) else f"{type(trace).__name__} {trace!r}")
        raise ValueError(f"trace must be new_trace({n_programs}) (a contiguous ({n_programs}, 3) int64 tensor on "
                         f"{device}: one row per program), got {got}")


def new_trace(n_programs: int, device: torch.device | str = "cuda") -> torch.Tensor:
    """An (n_programs, 3) int64 buffer for (SM, start ns, end ns), filled with -1 so a missing row shows."""
    if n_programs < 1:
        raise ValueError(f"n_programs must be at least 1, got {n_programs}")
    return torch.full((n_programs, 3), -1, dtype=torch.int64, device=device)


@dataclass
class Timeline:
    """One kernel launch: where (SM) and when (ns from the first program's start) each program ran."""

    label: str
    sm: list[int]
    start_ns: list[int]
    end_ns: list[int]
    sm_count: int
    meta: dict = field(default_factory=dict)

    @classmethod
    def from_trace(cls, trace: torch.Tensor, label: str, sm_count: int, **meta) -> "Timeline":
        rows = trace.cpu()
        missing = int((rows < 0).any(dim=1).sum())
        if missing:
            raise ValueError(f"{label}: {missing} of {rows.shape[0]} programs wrote no trace row "
                             "(did every program call program_end?)")
        t0 = int(rows[:, 1].min())
        return cls(label, rows[:, 0].tolist(), (rows[:, 1] - t0).tolist(), (rows[:, 2] - t0).tolist(), sm_count, meta)

    @classmethod
    def from_dict(cls, d: dict) -> "Timeline":
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def n_programs(self) -> int:
        return len(self.sm)

    @property
    def makespan_us(self) -> float:
        """From the first program's start to the last program's end."""
        return max(self.end_ns) / 1e3

    @property
    def sms_used(self) -> int:
        return len(set(self.sm))

    def lanes(self) -> list[int]:
        """A lane inside its SM for each program, so programs running at the same time get different lanes.

        Programs of one SM are taken in start order; each goes to the lowest lane free by its start.
        """
        lane = [0] * self.n_programs
        lane_free_at: dict[int, list[int]] = {}
        for p in sorted(range(self.n_programs), key=lambda p: (self.start_ns[p], p)):
            free = lane_free_at.setdefault(self.sm[p], [])
            slot = next((i for i, t in enumerate(free) if t <= self.start_ns[p]), len(free))
            if slot == len(free):
                free.append(0)
            free[slot] = self.end_ns[p]
            lane[p] = slot
        return lane

    def waves(self) -> list[int]:
        """Wave of each program, from 1: how many programs ran in its lane before it, plus one."""
        lanes = self.lanes()
        order = sorted(range(self.n_programs), key=lambda p: (self.start_ns[p], p))
        count: dict[tuple[int, int], int] = {}
        wave = [0] * self.n_programs
        for p in order:
            key = (self.sm[p], lanes[p])
            count[key] = count.get(key, 0) + 1
            wave[p] = count[key]
        return wave

    def max_resident_per_sm(self) -> int:
        """The most programs that ran at the same moment on one SM (their [start, end) intervals overlap)."""
        best = 0
        events: dict[int, list[tuple[int, int]]] = {}
        for sm, s, e in zip(self.sm, self.start_ns, self.end_ns):
            events.setdefault(sm, []).extend([(s, 1), (e, -1)])
        for evs in events.values():
            running = 0
            for _, step in sorted(evs, key=lambda t: (t[0], t[1])):  # an end before a start at the same ns
                running += step
                best = max(best, running)
        return best
