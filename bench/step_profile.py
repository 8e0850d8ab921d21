"""One training step under torch's profiler, broken down by kind of work: where a step's milliseconds go.

    from step_profile import profile_step
    profile = profile_step(step, device)     # step: a callable that runs one whole training step

Kinds: GEMM, attention, normalization, element-wise, loss, optimizer, copies, and host gaps (the time the device
waits for the host). On CUDA each kernel's device time counts, classified by its name and by the op that launched
it (a GEMM inside attention's backward is attention); host gaps are the step's wall time that no kernel covers, and
launches are the kernels (and memcpy/memset) the step ran. On a CPU the aten ops stand in for kernels: each aten
op's self time (its children's excluded, so nothing counts twice), classified by its name and its callers' names;
host gaps are the wall time outside any aten op (Python, the autograd engine's bookkeeping); launches are the aten
ops that call no other aten op (the ones that run a kernel).

`bench/pretrain_step.py --profile` prints it; `bench/gpu_check.py` keeps it per pre-training case (`"profile"`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

KINDS = ["GEMM", "attention", "normalization", "element-wise", "loss", "optimizer", "copies", "host gaps"]

# A caller whose name says what the work inside it is for, checked innermost first: attention's own matmuls count
# as attention, the optimizer's foreach adds as optimizer. Lower-case substrings.
CONTEXTS = [
    ("attention", ("scaled_dot_product", "scaleddotproduct", "flash_attention", "efficient_attention", "varlen")),
    ("optimizer", ("optimizer.step", "adam", "lamb", "masterweights")),
    ("loss", ("cross_entropy", "nll_loss", "nllloss", "log_softmax", "logsoftmax", "pretraining_losses")),
    ("normalization", ("layer_norm", "layernorm", "rms_norm", "rmsnorm")),
]  # an autograd node's name is CamelCase: NativeLayerNormBackward0
# A kernel's or op's own name, when no caller decided.
OWN = [
    ("loss", ("cross_entropy", "nll_loss", "log_softmax")),  # before attention's softmax
    ("attention", ("flash", "fmha", "attention", "sdpa", "softmax")),
    ("GEMM", ("gemm", "cutlass", "xmma", "cublas", "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
              "aten::_scaled_mm", "aten::matmul", "aten::linear", "sm90_", "sm80_", "ampere_", "hopper")),
    ("optimizer", ("adam", "lamb", "multi_tensor_apply")),
    ("normalization", ("layer_norm", "layernorm", "rms_norm")),
    ("copies", ("memcpy", "memset", "copy", "aten::to", "aten::_to_copy", "aten::clone", "aten::contiguous",
                "aten::cat", "aten::index", "aten::gather", "aten::scatter", "aten::fill_", "aten::zero_",
                "aten::embedding", "aten::pad", "aten::constant_pad_nd", "cast")),
]  # fmt: skip


def kind_of(name: str, callers: Iterable[str] = ()) -> str:
    """The kind of work a kernel or aten op `name` does, called inside `callers` (innermost first)."""
    for caller in callers:
        lowered = caller.lower()
        for kind, marks in CONTEXTS:
            if any(mark in lowered for mark in marks):
                return kind
    lowered = name.lower()
    for kind, marks in OWN:
        if any(mark in lowered for mark in marks):
            return kind
    return "element-wise"


def covered(intervals: Iterable[tuple[float, float]]) -> float:
    """The length of the union of (start, end) intervals: the time at least one of them runs."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def breakdown(times: dict[str, float], launches: int, wall_ms: float, busy_ms: float) -> dict:
    """The profile's record: ms and share of the step per kind (host gaps: the wall time nothing covered)."""
    ms = {kind: times.get(kind, 0.0) for kind in KINDS}
    ms["host gaps"] = max(wall_ms - busy_ms, 0.0)
    total = sum(ms.values()) or 1.0
    return {
        "step_ms": round(wall_ms, 3),
        "launches": launches,
        "kinds": {kind: {"ms": round(value, 3), "share": round(value / total, 4)} for kind, value in ms.items()},
    }


def callers(event) -> list[str]:
    names, parent = [], event.cpu_parent
    while parent is not None:
        names.append(parent.name)
        parent = parent.cpu_parent
    return names


def cpu_breakdown(events, wall_ms: float) -> dict:
    """From a CPU profile: aten ops' self times by kind; launches are the aten ops that call no aten op."""
    times: dict[str, float] = {}
    launches = 0
    busy = 0.0
    for event in events:
        if event.device_type != DeviceType.CPU or not event.name.startswith("aten::"):
            continue
        ms = event.self_cpu_time_total / 1e3
        kind = kind_of(event.name, callers(event))
        times[kind] = times.get(kind, 0.0) + ms
        busy += ms
        launches += not any(child.name.startswith("aten::") for child in event.cpu_children)
    return breakdown(times, launches, wall_ms, busy)


def cuda_breakdown(events, wall_ms: float) -> dict:
    """From a CUDA profile: every kernel's (and memcpy's, memset's) device time by kind, the launching op's callers
    deciding where its name does not; host gaps are the step's wall time no kernel covers."""
    launching = {e.id: e for e in events if e.device_type == DeviceType.CPU and e.linked_correlation_id == 0}
    times: dict[str, float] = {}
    intervals = []
    for event in events:
        if event.device_type != DeviceType.CUDA:
            continue
        op = launching.get(event.linked_correlation_id)
        context = [op.name, *callers(op)] if op is not None else []
        kind = "copies" if "memcpy" in event.name.lower() or "memset" in event.name.lower() else None
        kind = kind or kind_of(event.name, context)
        start, end = event.time_range.start, event.time_range.end
        times[kind] = times.get(kind, 0.0) + (end - start) / 1e3
        intervals.append((start, end))
    return breakdown(times, len(intervals), wall_ms, covered(intervals) / 1e3)


def profile_step(step: Callable[[], None], device: torch.device) -> dict:
    """One call of `step` (a whole training step, already warm) under torch's profiler, by kind."""
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - started) * 1e3
    events = prof.events()
    return cuda_breakdown(events, wall_ms) if cuda else cpu_breakdown(events, wall_ms)


def lines(profile: dict) -> list[str]:
    """The profile said on the console: one line per kind, then the record as JSON (what gpu_check.py reads)."""
    said = [f"profile        one steady step, {profile['step_ms']:.1f} ms, {profile['launches']} kernel launches"]
    for kind, value in profile["kinds"].items():
        said.append(f"profile        {kind:<14} {value['ms']:9.2f} ms {100 * value['share']:5.1f}%")
    return [*said, "profile json: " + json.dumps(profile)]
