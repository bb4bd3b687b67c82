"""analysis/traces.py's GPU breakdown against Holistic Trace Analysis 0.5.0 (a test-only dependency:
pyproject.toml's `test` extra), on the same kernels.

No GPU here, so the traces are made: what torch.profiler writes for a data-parallel step on a CUDA
device, one file per rank, fixed seeds. Per step: the batch copied in (Memcpy HtoD), a Memset,
forward kernels with an NCCL all-gather beside them and its output copied out (Memcpy DtoD on a
copy stream), backward kernels with reduce-scatters and all-reduces partly behind them, gradient
copies beside the last, exposed all-reduce, an optimizer step and the loss copied out (Memcpy DtoH);
launch gaps and host stalls between kernels; every device event launched by a cuda_runtime call of
the training thread inside its ProfilerStep#<k> range (HTA keeps only the kernels of the steps
before the last), with the metadata HTA's parser reads (distributedInfo, deviceProperties).
Timestamps in µs with ns decimals, as torch 2.x writes them; HTA then rounds every event inward to
whole µs unless HTA_DISABLE_NS_ROUNDING=1, which the test sets so that both sides see the kernels as
recorded (docs/profiling.md).
"""

import gzip
import json
import os
import random
import sys

import pytest

from conftest import ROOT, require_package

require_package("hta", "pip install -e '.[test]' (HolisticTraceAnalysis)")
from hta.trace_analysis import TraceAnalysis  # noqa: E402

sys.path.insert(0, ROOT)
from analysis import traces  # noqa: E402

RANKS = 4
STEPS = 4
STREAM_COMPUTE, STREAM_NCCL, STREAM_COPY = 7, 20, 24
GEMM = "sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1_tensor16x8x16_kernel"
ELEMENTWISE = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
    "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)"
)
SOFTMAX = "void (anonymous namespace)::softmax_warp_forward<c10::Half, c10::Half, float, 8, false, false>(c10::Half*)"
ALL_GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
REDUCE_SCATTER = "ncclKernel_ReduceScatter_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
ALL_REDUCE = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"


class RankTrace:
    """One rank's trace: the training thread launches, three streams run what it launched."""

    def __init__(self, rank: int):
        self.rank, self.rng = rank, random.Random(1000 + rank)
        self.events: list = []
        self.cpu = 5_000_000_000.0 + 37.0 * rank  # µs, like a profiler's clock
        self.free = {STREAM_COMPUTE: self.cpu, STREAM_NCCL: self.cpu, STREAM_COPY: self.cpu}
        self.correlation = 1000 * (rank + 1)

    def host(self, lo: float, hi: float) -> None:
        self.cpu += self.rng.uniform(lo, hi)

    def launch(self, stream: int, name: str, dur: float, cat: str = "kernel", after: float = 0.0) -> float:
        """Launch from the training thread; runs when the stream is free and `after` has passed."""
        self.correlation += 1
        api = {
            "kernel": "cudaLaunchKernel",
            "gpu_memcpy": "cudaMemcpyAsync",
            "gpu_memset": "cudaMemsetAsync",
            "cuda_sync": "cudaStreamWaitEvent",
        }[cat]
        call = self.rng.uniform(3.0, 7.0)
        self.event("cuda_runtime", api, self.cpu, call, pid=1234, tid=1234, correlation=self.correlation)
        start = max(self.free[stream], self.cpu + self.rng.uniform(4.0, 9.0), after)
        start += self.rng.choice((0.0, 0.0, 0.0, self.rng.uniform(1.0, 4.0)))  # launch gaps
        self.event(cat, name, start, dur, pid=0, tid=stream, stream=stream, device=0, correlation=self.correlation)
        self.cpu += call + self.rng.uniform(1.0, 3.0)
        self.free[stream] = start + dur
        return start + dur

    def event(self, cat, name, ts, dur, pid, tid, **args) -> None:
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": pid,
                "tid": tid,
                "ts": round(ts, 3),
                "dur": round(dur, 3),
                "args": args,
            }
        )

    def compute(self, n: int, scale: float) -> None:
        for _ in range(n):
            name, dur = self.rng.choice(((GEMM, 60.0), (GEMM, 110.0), (ELEMENTWISE, 9.0), (SOFTMAX, 25.0)))
            self.launch(STREAM_COMPUTE, name, dur * scale * self.rng.uniform(0.8, 1.25))
            if self.rng.random() < 0.08:
                self.host(40.0, 120.0)  # a host stall: the device idles

    def collective(self, name: str, dur: float) -> float:
        ready = self.free[STREAM_COMPUTE]
        self.launch(STREAM_NCCL, "Stream Wait Event", self.rng.uniform(1.0, 2.0), "cuda_sync", after=ready)
        return self.launch(STREAM_NCCL, name, dur * self.rng.uniform(0.7, 1.5), after=ready)

    def step(self, k: int) -> None:
        begin = self.cpu
        self.host(150.0, 700.0)  # waiting on the data loader
        self.launch(STREAM_COMPUTE, "Memcpy HtoD (Pageable -> Device)", self.rng.uniform(150, 260), "gpu_memcpy")
        self.launch(STREAM_COMPUTE, "Memset (Device)", self.rng.uniform(2, 6), "gpu_memset")
        for _ in range(3):  # forward: all-gather, copy-out, layers
            gathered = self.collective(ALL_GATHER, 260.0)
            self.launch(
                STREAM_COPY, "Memcpy DtoD (Device -> Device)", self.rng.uniform(60, 140), "gpu_memcpy", after=gathered
            )
            self.compute(12, 1.0)
        for _ in range(3):  # backward: gradients out behind compute
            self.compute(14, 1.6)
            self.collective(REDUCE_SCATTER, 420.0)
        reduced = self.collective(ALL_REDUCE, 900.0)  # the last bucket: nothing computes behind
        for _ in range(2):
            self.launch(
                STREAM_COPY,
                "Memcpy DtoD (Device -> Device)",
                self.rng.uniform(30, 70),
                "gpu_memcpy",
                after=reduced - 300.0,
            )
        self.free[STREAM_COMPUTE] = max(self.free.values())  # the optimizer waits for the gradients
        self.compute(10, 0.5)
        end = self.launch(STREAM_COMPUTE, "Memcpy DtoH (Device -> Pageable)", self.rng.uniform(3, 8), "gpu_memcpy")
        self.cpu = max(self.cpu, end) + self.rng.uniform(5.0, 30.0)  # loss.item() waits for the device
        self.event("user_annotation", f"ProfilerStep#{k}", begin, self.cpu - begin, pid=1234, tid=1234)
        self.host(20.0, 80.0)

    def write(self, directory) -> str:
        for k in range(1, STEPS + 1):
            self.step(k)
        meta = [
            {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
            {"name": "thread_name", "ph": "M", "pid": 1234, "tid": 1234, "args": {"name": "python"}},
        ]
        doc = {
            "schemaVersion": 1,
            "distributedInfo": {"backend": "nccl", "rank": self.rank, "world_size": RANKS},
            "deviceProperties": [
                {
                    "id": 0,
                    "name": "NVIDIA H100 80GB HBM3",
                    "totalGlobalMem": 85045379072,
                    "computeMajor": 9,
                    "computeMinor": 0,
                    "numSms": 132,
                    "warpSize": 32,
                }
            ],
            "traceEvents": meta + sorted(self.events, key=lambda e: e["ts"]),
        }
        path = os.path.join(str(directory), f"rank-{self.rank}.json.gz")
        with gzip.open(path, "wt") as f:
            json.dump(doc, f)
        return path


def ours_on_hta_kernels(path: str, analysed) -> dict:
    """traces.split over the device events HTA analysed (by correlation), from the first to the last."""
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    device = [
        e
        for e in events
        if e.get("ph") == "X" and e.get("pid") == 0 and e.get("args", {}).get("correlation") in analysed
    ]
    classes = traces.classify(device)
    lo, hi = min(e["ts"] for e in device), max(e["ts"] + e["dur"] for e in device)
    got = traces.split(classes, lo - classes.origin, hi - classes.origin)
    got["memory_as_compute"] = traces.length(traces.union(classes.compute + classes.memory))
    got["overlap_pct"] = 100.0 * got["overlapped"] / (got["overlapped"] + got["exposed"])
    return got


def test_breakdown_agrees_with_hta_on_the_same_kernels(tmp_path, monkeypatch):
    """Per rank: overlap within 0.5 points of HTA's get_comm_comp_overlap, compute within 2% and idle within
    0.5 points of HTA's get_temporal_breakdown. The traces are made (no GPU here): see the module's docstring."""
    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    files = {rank: RankTrace(rank).write(tmp_path) for rank in range(RANKS)}
    analysis = TraceAnalysis(trace_files=files, trace_dir=str(tmp_path))
    temporal = analysis.get_temporal_breakdown(visualize=False).set_index("rank")
    overlap = analysis.get_comm_comp_overlap(visualize=False).set_index("rank")
    rows = []
    for rank, path in files.items():
        df = analysis.t.traces[rank]
        analysed = set(df.loc[df["stream"].ne(-1), "correlation"])
        got = ours_on_hta_kernels(path, analysed)
        hta = temporal.loc[rank]
        rows.append((rank, got, hta, overlap.loc[rank, "comp_comm_overlap_pctg"]))
    table = "\n".join(
        f"rank {r}: compute {g['compute']:.0f} µs (HTA {h['compute_time(us)']:.0f}), overlap "
        f"{g['overlap_pct']:.2f}% (HTA {o:.2f}%), idle {g['idle']:.0f} µs "
        f"(HTA {h['idle_time(us)']:.0f}), memory {g['memory']:.0f} µs"
        for r, g, h, o in rows
    )
    print(table)
    for _rank, got, hta, hta_overlap in rows:
        # the traces must tell the classes apart: memory counted as compute would be off by far more than 2%
        assert got["memory_as_compute"] > 1.03 * hta["compute_time(us)"], table
        assert abs(got["overlap_pct"] - hta_overlap) <= 0.5, table
        assert abs(got["compute"] / hta["compute_time(us)"] - 1) <= 0.02, table
        assert abs(got["idle"] - hta["idle_time(us)"]) <= 0.005 * hta["kernel_time(us)"], table
        assert got["compute"] + got["memory"] + got["exposed"] + got["idle"] == pytest.approx(got["step"])
