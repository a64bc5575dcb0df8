"""Video classification as a pipeline (decode -> preprocess -> infer -> postprocess) and its benchmark.

``video_pipeline(source, model)`` builds the four stages: decode on a plain thread (codec or
frame synthesis work), preprocess (uint8 HWC frame -> resized, normalized NCHW float32, a
compiled graph), infer (the compiled CNN) and postprocess (softmax + top-k) each on a thread
and opsnn Stream of its own; inference takes up to ``infer_batch`` waiting frames per model
call. ``video_bench`` runs the same stages pipelined and one after another (frame by frame) on
the same frames and compares frames/s::

    >>> from opsnn.pipeline import video_pipeline, SyntheticVideo
    >>> src = SyntheticVideo(4, height=64, width=80)
    >>> pipe = video_pipeline(src, model="smallnet", image_size=32)    # doctest: +SKIP
    >>> [r["top"][0] for r in pipe.run(src).outputs]                   # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import queue
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

from .. import ops
from ..errors import ParamInvalidError
from ..runtime.stream import current_stream
from ..tensor import from_numpy
from .engine import Pipeline, Stage
from .sources import (
    ImageFolder,
    SyntheticVideo,
    VideoFile,
    have_video_support,
    synth_frame,
    write_image_folder,
    write_video,
)

#: ImageNet channel statistics (in 0..255 units), the usual classifier normalization
MEAN = np.array([0.485, 0.456, 0.406], np.float32) * 255
STD = np.array([0.229, 0.224, 0.225], np.float32) * 255

MODELS = ("resnet18", "resnet50", "smallnet")


def build_model(name: str, image_size: int, num_classes: int = 1000, seed: int = 0):
    """A compiled classifier over ``(batch, 3, image_size, image_size)`` float32 inputs
    (deterministic random weights; the batch dimension is dynamic, each batch size gets a plan
    of its own on first use)."""
    from .. import models
    from ..frontend import compile

    if name not in MODELS:
        raise ParamInvalidError(f"video model must be one of {MODELS}, got {name!r}")
    if not isinstance(image_size, int) or image_size < 8:
        raise ParamInvalidError(f"video model: image_size must be an int >= 8, got {image_size!r}")
    example = np.zeros((1, 3, image_size, image_size), np.float32)
    if name == "smallnet":
        net = models.SmallConvNet(seed=seed, num_classes=num_classes, image_size=image_size)
    else:
        net = getattr(models, name)(num_classes=num_classes, seed=seed)
    return compile(net, [example], dynamic_dims={0: {0: "batch"}})


def preprocess_graph(frame_shape: tuple, image_size: int):
    """The compiled preprocess: ``(H, W, 3)`` uint8 -> NCHW -> float32 -> bilinear resize to
    ``image_size`` -> ``(x - mean) / std``."""
    from ..frontend import compile
    from ..tensor import tensor

    mean = tensor(MEAN.reshape(1, 3, 1, 1))
    inv_std = tensor((1.0 / STD).reshape(1, 3, 1, 1))

    def preprocess(frame):
        x = ops.unsqueeze(ops.permute(frame, 2, 0, 1), 0)  # move bytes before widening them to float32
        x = ops.cast(x, "float32")
        x = ops.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False)
        return ops.mul(ops.sub(x, mean), inv_std)

    return compile(preprocess, [np.zeros(frame_shape, np.uint8)])


#: inference workers by default: two single-threaded replicas keep two cores busier than one
#: replica using both cores per kernel (docs/performance.md, "Video pipeline")
DEFAULT_INFER_WORKERS = 2

#: frames per inference call by default (models built by name): two frames cost far less than
#: twice one (a small model's deep layers are 7x7 and 4x4 maps: one frame makes thin GEMMs, and
#: its weights stream from memory per call); three gain nothing more (docs/performance.md)
DEFAULT_INFER_BATCH = 2


def decode_workers_for(source, decode_workers: int = 1) -> int:
    """Check ``decode_workers``: several workers need a source whose frames decode independently
    (``source.independent_frames``: image files, synthesized frames; a video file's frames come
    out of one decoder in sequence). On 2 cores, 2 workers pay off only when decode is the
    slowest stage and its work is compute-bound (PNG files); rendering synthetic frames is
    memory-bound and a second worker slows inference more than it speeds decode
    (docs/performance.md, "Video pipeline"). So the default is 1."""
    if isinstance(decode_workers, bool) or not isinstance(decode_workers, int) or decode_workers < 1:
        raise ParamInvalidError(f"video_pipeline: decode_workers must be an int >= 1, got {decode_workers!r}")
    if decode_workers > 1 and not getattr(source, "independent_frames", False):
        raise ParamInvalidError(
            f"video_pipeline: {type(source).__name__} decodes frames in sequence, so "
            f"decode_workers must be 1, got {decode_workers}"
        )
    return decode_workers


def video_pipeline(
    source,
    model="resnet18",
    image_size: int = 224,
    top_k: int = 5,
    queue_size: int | None = None,
    frame_shape: tuple | None = None,
    decode_workers: int = 1,
    infer_workers: int | None = None,
    infer_batch: int | None = None,
) -> Pipeline:
    """The four-stage classification pipeline over ``source`` (a :mod:`~opsnn.pipeline.sources`
    source). ``model``: a name from :data:`MODELS` or a CompiledGraph taking one
    ``(batch, 3, image_size, image_size)`` float32 input (batch 1, or up to ``infer_batch``)
    and returning logits. Each output is
    ``{"top": [class ids], "prob": [probabilities]}`` (frame ``i`` is ``outputs[i]``).
    ``decode_workers``: see :func:`decode_workers_for` (frames still leave in order).
    ``infer_workers``: inference runs that many frames side by side, each worker on a compiled
    copy of the model of its own (a compiled graph's plan holds one set of activation buffers,
    so two runs at once need two; the weights are shared); frames still leave in order. Default:
    2 on a machine with 2 or more cores (each worker's kernels use half the cores), else 1.
    ``infer_batch``: at most that many frames per model call (the frames already waiting when a
    worker takes one; see ``Stage.max_batch``): the weights are read once per call and the
    small deep layers make larger GEMMs, so a frame costs less, at the price of holding up to
    that many frames together. The model is planned for every batch size up to it. Default:
    :data:`DEFAULT_INFER_BATCH` for a model given by name (built with a dynamic batch
    dimension), 1 for a compiled model passed in.
    ``queue_size`` (frames waiting between two stages; default ``infer_workers + 1``, so that
    every inference worker finds a frame ready and one more is on its way)."""
    if not hasattr(source, "decode"):
        raise ParamInvalidError(
            f"video_pipeline: source must have a decode(packet) method (SyntheticVideo, "
            f"VideoFile, ImageFolder), got {type(source).__name__}"
        )
    if not isinstance(top_k, int) or top_k < 1:
        raise ParamInvalidError(f"video_pipeline: top_k must be an int >= 1, got {top_k!r}")
    n_decode = decode_workers_for(source, decode_workers)
    if infer_workers is None:
        infer_workers = DEFAULT_INFER_WORKERS if (os.cpu_count() or 1) >= 2 else 1
    if isinstance(infer_workers, bool) or not isinstance(infer_workers, int) or infer_workers < 1:
        raise ParamInvalidError(f"video_pipeline: infer_workers must be an int >= 1, got {infer_workers!r}")
    if infer_batch is None:
        infer_batch = DEFAULT_INFER_BATCH if isinstance(model, str) else 1
    if isinstance(infer_batch, bool) or not isinstance(infer_batch, int) or infer_batch < 1:
        raise ParamInvalidError(f"video_pipeline: infer_batch must be an int >= 1, got {infer_batch!r}")
    if queue_size is None:
        # one slot more than the inference workers keeps each of them fed (docs/performance.md)
        queue_size = infer_workers + 1
    cg = build_model(model, image_size) if isinstance(model, str) else model
    if frame_shape is None:
        frame_shape = (source.height, source.width, 3)
    pre = preprocess_graph(tuple(frame_shape), image_size)
    # plan both graphs now, on this thread: stage threads then only replay
    x0 = pre.run([np.zeros(frame_shape, np.uint8)])[0]
    batches = [np.zeros((k,) + tuple(x0.shape[1:]), np.float32) for k in range(2, infer_batch + 1)]
    logits0 = cg.run([x0])[0]
    models = queue.SimpleQueue()  # the compiled copies free to run a frame
    for copy in [cg] + [cg.replica() for _ in range(infer_workers - 1)]:
        for xb in [x0] + batches:  # a plan for every batch size
            try:
                copy.run([xb])
            except ParamInvalidError as exc:
                raise ParamInvalidError(
                    f"video_pipeline: infer_batch={infer_batch} needs a model whose batch "
                    f"dimension may change (compile it with dynamic_dims={{0: {{0: 'batch'}}}}): "
                    f"{exc}"
                ) from None
        models.put(copy)
    n_classes = logits0.shape[-1]
    if top_k > n_classes:
        raise ParamInvalidError(f"video_pipeline: top_k={top_k} exceeds the model's {n_classes} classes")

    def decode(packet):
        frame = source.decode(packet)
        if frame.shape != tuple(frame_shape):
            raise ParamInvalidError(
                f"decode: frame has shape {frame.shape}, the pipeline was built for {tuple(frame_shape)}"
            )
        return frame

    def preprocess(frame):
        return pre.run([from_numpy(frame)])[0]

    def infer(xs):
        m = models.get()  # never waits: there are as many copies as workers
        try:
            y = m.run([xs[0] if len(xs) == 1 else ops.concat(xs, 0)])[0]
            current_stream().synchronize()  # m's buffers are free once its kernels are done
        finally:
            models.put(m)
        return [y[i : i + 1] for i in range(len(xs))]

    def postprocess(logits):
        probs = ops.softmax(logits, dim=-1)
        vals, idx = ops.topk(probs, top_k, dim=-1)
        return {"top": idx.numpy()[0].tolist(), "prob": vals.numpy()[0].tolist()}

    return Pipeline(
        [
            Stage("decode", decode, uses_ops=False, workers=n_decode),
            Stage("preprocess", preprocess),
            Stage("infer", infer, workers=infer_workers, max_batch=infer_batch),
            Stage("postprocess", postprocess),
        ],
        queue_size=queue_size,
    )


# -- the benchmark ------------------------------------------------------------------------------------------
def make_source(kind: str, frames: int, height: int, width: int, workdir: str):
    """A source of ``frames`` synthesized frames: in memory (``synthetic``), encoded to an H.264
    file (``video``), or written to a folder of ``png`` / ``npy`` files under ``workdir``."""
    if kind == "synthetic":
        return SyntheticVideo(frames, height, width)
    gen = (synth_frame(i, height, width) for i in range(frames))
    if kind == "video":
        if not have_video_support():
            raise ParamInvalidError("video source: needs PyAV (pip install av, or opsnn[video])")
        path = write_video(os.path.join(workdir, "bench.mp4"), gen)
        return VideoFile(path)
    if kind in ("png", "npy"):
        write_image_folder(os.path.join(workdir, "frames"), gen, fmt=kind)
        return ImageFolder(os.path.join(workdir, "frames"))
    raise ParamInvalidError(f"video source must be synthetic, video, png or npy, got {kind!r}")


def video_bench(
    frames: int = 48,
    model: str = "resnet18",
    image_size: int = 112,
    height: int = 720,
    width: int = 1280,
    source: str = "auto",
    queue_size: int | None = None,
    repeat: int = 3,
    decode_workers: int = 1,
    infer_workers: int | None = None,
    infer_batch: int | None = None,
    log=None,
) -> dict:
    """Frames/s of the four stages pipelined vs one after another (same model, same frames);
    medians over ``repeat`` runs of each setting, alternated; each mode is represented by its
    fastest setting (see the variants below; with ``infer_batch`` > 1 the pipelined settings
    include the same pipeline one frame per model call, ``pipelined_batch1``, so the report
    shows what overlap alone gives). Returns a JSON-ready dict."""
    from ..runtime import init

    if source == "auto":
        source = "video" if have_video_support() else "synthetic"
    for n, v, lo in (("frames", frames, 1), ("repeat", repeat, 1), ("height", height, 8), ("width", width, 8)):
        if not isinstance(v, int) or v < lo:
            raise ParamInvalidError(f"video_bench: {n} must be an int >= {lo}, got {v!r}")
    init()
    workdir = tempfile.mkdtemp(prefix="opsnn-video-")
    try:
        src = make_source(source, frames, height, width, workdir)
        t0 = time.perf_counter()
        pipe = video_pipeline(
            src,
            model=model,
            image_size=image_size,
            queue_size=queue_size,
            decode_workers=decode_workers,
            infer_workers=infer_workers,
            infer_batch=infer_batch,
        )
        build_s = time.perf_counter() - t0
        warm = _Subset(src, list(src)[: min(3, frames)])
        pipe.run_sequential(warm, collect=False)  # JIT caches and plans are warm for both modes
        pipe.run(warm, collect=False)
        from ..runtime.blas import get_blas_threads

        default_blas = get_blas_threads()
        # Both modes run over the same settings and each is represented by its fastest: the BLAS
        # pool as it is or the pipeline's (sequential only; a pipelined run sets its own) and, for
        # a video file, one or two libavcodec threads. Two threads (frame threading) decode later
        # frames in the background: a pipelined run's decode stage, its bottleneck, then uses the
        # cores the other stages leave idle; a sequential run's inference competes with them
        blas = {"": None}
        if pipe.blas_threads is not None and default_blas is not None and pipe.blas_threads != default_blas:
            blas[f"_blas{pipe.blas_threads}"] = pipe.blas_threads
        sources = {"": src}
        if isinstance(src, VideoFile):
            sources["_decode2"] = VideoFile(src.path, threads=2)
        variants = {f"sequential{b}{d}": (bt, sv) for b, bt in blas.items() for d, sv in sources.items()}
        pipes = {"": pipe}
        infer = pipe.stages[2]
        if infer.max_batch > 1:  # the same stages (and compiled models), one frame per model call
            pipes["_batch1"] = Pipeline(
                [*pipe.stages[:2], dataclasses.replace(infer, max_batch=1), pipe.stages[3]],
                queue_size=pipe.queue_size,
                blas_threads=pipe.blas_threads,
            )
        variants.update({f"pipelined{b}{d}": (pv, sv) for b, pv in pipes.items() for d, sv in sources.items()})
        runs: dict = {k: [] for k in variants}
        cpu: dict = {k: [] for k in runs}
        for r in range(repeat):
            for name, (how, sv) in variants.items():  # how: the Pipeline, or the BLAS pool size
                c0 = time.process_time()
                if name.startswith("pipelined"):
                    res = how.run(sv)
                else:
                    res = pipe.run_sequential(sv, blas_threads=how)
                cpu[name].append((time.process_time() - c0) / res.wall_s)
                runs[name].append(res)
            if log:
                log(
                    f"run {r + 1}/{repeat}: " + ", ".join(f"{k} {v[-1].fps:.2f}" for k, v in runs.items()) + " frames/s"
                )
        fps = {k: statistics.median(x.fps for x in v) for k, v in runs.items()}
        seq_name = max((k for k in variants if k.startswith("sequential")), key=lambda k: fps[k])
        pipe_name = max((k for k in variants if k.startswith("pipelined")), key=lambda k: fps[k])
        seq_fps, pipe_fps = fps[seq_name], fps[pipe_name]
        ref = runs[seq_name][0].outputs
        same = all(
            [o["top"] for o in v[0].outputs] == [o["top"] for o in ref]
            and np.allclose([o["prob"] for o in v[0].outputs], [o["prob"] for o in ref], rtol=1e-4, atol=1e-6)
            for v in runs.values()
        )

        def typical(name):  # the run whose fps is the median, for its stage timings
            return min(runs[name], key=lambda x: abs(x.fps - fps[name])).as_dict()

        return {
            "workload": {
                "frames": frames,
                "frame": [height, width, 3],
                "source": source,
                "model": model,
                "image_size": image_size,
                "queue_size": pipe.queue_size,
                "repeat": repeat,
                "decode_workers": pipe.stages[0].workers,
                "infer_workers": pipe.stages[2].workers,
                "infer_batch": pipe.stages[2].max_batch,
                "cpu_count": os.cpu_count(),
                "blas_threads_default": default_blas,
                "blas_threads_pipelined": pipe.blas_threads,
            },
            "build_s": round(build_s, 3),
            "sequential_fps": round(seq_fps, 3),
            "sequential_baseline": seq_name,
            "pipelined_fps": round(pipe_fps, 3),
            "pipelined_best": pipe_name,
            "ratio": round(pipe_fps / seq_fps, 3) if seq_fps else None,
            "outputs_match": bool(same),
            "fps_by_mode": {k: round(v, 3) for k, v in fps.items()},
            "sequential": typical(seq_name),
            "pipelined": typical(pipe_name),
            # process CPU seconds per wall second: how many cores each mode kept busy
            "cores_busy": {k: round(statistics.median(v), 2) for k, v in cpu.items()},
            "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
            "all_runs": {k: [round(x.fps, 3) for x in v] for k, v in runs.items()},
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


class _Subset:
    """The first packets of a source (warm-up), with its decode."""

    def __init__(self, src, packets):
        self.packets, self.decode = packets, src.decode

    def __iter__(self):
        return iter(self.packets)

    def __len__(self):
        return len(self.packets)


def format_report(rep: dict) -> str:
    """The human-readable bench report: frames/s both ways, the ratio, per-stage timings."""
    w = rep["workload"]
    lines = [
        f"video pipeline: {w['frames']} frames {w['frame'][1]}x{w['frame'][0]} from {w['source']}, "
        f"{w['model']} at {w['image_size']}x{w['image_size']}, queue {w['queue_size']}, "
        f"{w['decode_workers']} decode worker{'s' if w['decode_workers'] > 1 else ''}, "
        f"{w.get('infer_workers', 1)} infer worker{'s' if w.get('infer_workers', 1) > 1 else ''} "
        f"of up to {w.get('infer_batch', 1)} frame{'s' if w.get('infer_batch', 1) > 1 else ''} a call, "
        f"{w['cpu_count']} cores, median of {w['repeat']}",
        *[
            f"  {k:<25}: {v:8.2f} frames/s"
            + ("  <- baseline" if k == rep["sequential_baseline"] else "")
            + ("  <- best pipelined" if k == rep["pipelined_best"] else "")
            for k, v in rep["fps_by_mode"].items()
        ],
        f"  pipelined runs {rep['ratio']:.2f}x the frames/s of sequential "
        f"({rep['pipelined_best']} / {rep['sequential_baseline']})",
        f"  outputs agree in every mode (same top classes, probabilities to 1e-4): {rep['outputs_match']}",
        "  cores kept busy (process CPU s / wall s): "
        + ", ".join(f"{k} {v:.2f}" for k, v in rep["cores_busy"].items())
        + f"; machine load average {rep['load_average_1m']}",
        "",
        "  per stage (sequential: the baseline run; pipelined: busy = running the stage incl. its kernels,",
        "  wait in = starved by the stage before, wait out = held back by a full queue to the next):",
        f"  {'stage':<12} {'seq ms/frame':>12} {'pipe ms/frame':>13} {'pipe busy s':>11} "
        f"{'wait in s':>9} {'wait out s':>10}",
    ]
    for s, p in zip(rep["sequential"]["stages"], rep["pipelined"]["stages"]):
        lines.append(
            f"  {s['stage']:<12} {s['busy_ms_per_frame']:>12.2f} {p['busy_ms_per_frame']:>13.2f} "
            f"{p['busy_s']:>11.3f} {p['wait_in_s']:>9.3f} {p['wait_out_s']:>10.3f}"
        )
    lat = rep["pipelined"].get("latency_ms") or {}
    if lat:
        lines.append(f"\n  pipelined latency per frame: p50 {lat['p50']:.1f} ms, max {lat['max']:.1f} ms")
    return "\n".join(lines)


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Video pipeline benchmark: decode -> preprocess -> infer "
        "-> postprocess, pipelined (a thread + stream per stage) vs sequential.",
    )
    p.add_argument("--frames", type=int, default=48)
    p.add_argument("--model", choices=MODELS, default="resnet18")
    p.add_argument("--image-size", type=int, default=112, help="the model's input size (frames are resized)")
    p.add_argument("--height", type=int, default=720, help="frame height (frames are decoded at this size)")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument(
        "--source",
        choices=["auto", "synthetic", "video", "png", "npy"],
        default="auto",
        help="auto: an H.264 file when PyAV (av) is installed, else synthesized frames",
    )
    p.add_argument(
        "--queue-size", type=int, default=None, help="frames queued between stages (default: infer workers + 1)"
    )
    p.add_argument(
        "--decode-workers",
        type=int,
        default=1,
        help="decode stage workers for image folders and synthetic frames (frames stay in order)",
    )
    p.add_argument(
        "--infer-workers",
        type=int,
        default=None,
        help="inference stage workers, each on its own compiled copy of the model (frames stay in "
        f"order); default {DEFAULT_INFER_WORKERS} on 2 or more cores",
    )
    p.add_argument(
        "--infer-batch",
        type=int,
        default=None,
        help=f"frames per inference call at most (those already waiting); default {DEFAULT_INFER_BATCH}",
    )
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", help="also write the report as JSON here")
    return p


def cli_video_bench(argv=None, prog: str = "opsnn video-bench") -> int:
    """``opsnn video-bench``: run :func:`video_bench` and print frames/s, the ratio and stage timings."""
    args = _parser(prog).parse_args(argv)
    try:
        rep = video_bench(
            frames=args.frames,
            model=args.model,
            image_size=args.image_size,
            height=args.height,
            width=args.width,
            source=args.source,
            queue_size=args.queue_size,
            repeat=args.repeat,
            decode_workers=args.decode_workers,
            infer_workers=args.infer_workers,
            infer_batch=args.infer_batch,
            log=lambda m: print(m, file=sys.stderr),
        )
    except ParamInvalidError as exc:
        print(f"opsnn video-bench: {exc}", file=sys.stderr)
        return 2
    print(format_report(rep))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rep, f, indent=1)
        print(f"\nwrote {args.json}")
    return 0
