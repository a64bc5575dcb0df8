"""The streaming pipeline (opsnn.pipeline): order, back-pressure, streams per stage, timings,
failures (typed error naming stage and frame, nothing lost, threads and memory back to
baseline), frame sources, the video classification pipeline and its benchmark CLI.

Oracles: frame indices and hand-computed values for the engine; numpy preprocessing (a
bilinear resize written here) + the model run directly for the video pipeline; the frames
that were written for the sources.
"""

import gc
import json
import os
import threading
import time

import numpy as np
import pytest

import opsnn
from opsnn import ops
from opsnn.errors import ParamInvalidError
from opsnn.pipeline import (
    ImageFolder,
    Pipeline,
    Stage,
    StageError,
    SyntheticVideo,
    VideoFile,
    cli_video_bench,
    synth_frame,
    video_bench,
    video_pipeline,
    write_image_folder,
    write_video,
)
from opsnn.pipeline.sources import have_png_support, have_video_support
from opsnn.pipeline.video import MEAN, STD, build_model, format_report


def _threads():
    gc.collect()
    return threading.active_count()


def _scale_stage(a):
    return ops.mul(opsnn.tensor(a), 2.0).numpy().copy()


# -- the engine -------------------------------------------------------------------------------------------
def test_frames_in_order_with_uneven_stages(no_leak):
    rng = np.random.default_rng(1)
    delays = rng.uniform(0, 0.004, (3, 40))

    def slow(k):
        def fn(v):
            time.sleep(delays[k][v[0]])  # sleeps release the GIL, so frames overtake unless ordered
            return v + (k,)

        return fn

    base = _threads()
    pipe = Pipeline(
        [
            Stage("a", lambda i: (i,), uses_ops=False),
            Stage("b", slow(0)),
            Stage("c", slow(1), uses_ops=False),
            Stage("d", slow(2)),
        ],
        queue_size=1,
    )
    res = pipe.run(range(40))
    assert res.outputs == [(i, 0, 1, 2) for i in range(40)]
    assert res.completed == list(range(40)) and not res.failed and not res.not_processed
    assert [s.frames for s in res.stages] == [40] * 4
    assert all(s.busy_s >= 0 and s.wait_in_s >= 0 and s.wait_out_s >= 0 for s in res.stages)
    assert res.fps > 0 and len(res.latency_s) == 40
    assert _threads() == base


def test_back_pressure_bounds_frames_in_flight():
    read = []
    consumed = []

    def source():
        for i in range(30):
            read.append(i)
            yield i

    def slow_sink(v):
        time.sleep(0.003)
        consumed.append(v)
        return v

    q = 2
    pipe = Pipeline(
        [
            Stage("decode", lambda i: i, uses_ops=False),
            Stage("mid", lambda v: v, uses_ops=False),
            Stage("sink", slow_sink, uses_ops=False),
        ],
        queue_size=q,
    )
    ahead = []
    res = pipe.run(source(), on_output=lambda i, v: ahead.append(len(read) - len(consumed)))
    assert res.outputs == list(range(30))
    # frames read but not yet through the slow stage: at most one per stage plus each bounded queue
    assert max(ahead) <= 3 + 3 * q
    decode = res.stages[0]
    assert decode.wait_out_s > 0.02  # the decoder was held back by the full queue


def test_ops_stages_run_on_their_own_streams(no_leak):
    seen = {}

    def record(name):
        def fn(x):
            s = opsnn.current_stream()
            seen[name] = (s.name, s.inline, threading.current_thread().name)
            return ops.add(opsnn.tensor(x), 1.0).numpy().copy()

        return fn

    base = _threads()
    pipe = Pipeline(
        [
            Stage("decode", lambda i: np.full(4, i, np.float32), uses_ops=False),
            Stage("pre", record("pre")),
            Stage("post", record("post")),
        ]
    )
    res = pipe.run(range(5))
    np.testing.assert_array_equal(np.stack(res.outputs), np.repeat(np.arange(5, dtype=np.float32)[:, None] + 2, 4, 1))
    assert seen["pre"][0] == "pipeline:pre" and seen["post"][0] == "pipeline:post"
    assert not seen["pre"][1] and seen["pre"][2] != seen["post"][2]
    assert _threads() == base  # the stage threads and their streams' workers are gone
    assert all(s._closed for s in opsnn.context().streams() if s.name.startswith("pipeline:"))


def test_sequential_mode_same_outputs_and_timings(no_leak):
    pipe = Pipeline(
        [Stage("decode", lambda i: np.full(3, i, np.float32), uses_ops=False), Stage("double", _scale_stage)]
    )
    seq = pipe.run_sequential(range(6))
    par = pipe.run(range(6))
    np.testing.assert_array_equal(np.stack(seq.outputs), np.stack(par.outputs))
    assert seq.mode == "sequential" and par.mode == "pipelined"
    assert [s.frames for s in seq.stages] == [6, 6]
    d = seq.as_dict()
    assert d["frames"] == 6 and {s["stage"] for s in d["stages"]} == {"decode", "double"}


def test_iter_yields_in_order_and_early_close_stops_threads(no_leak):
    base = _threads()
    pipe = Pipeline(
        [Stage("decode", lambda i: np.full(2, i, np.float32), uses_ops=False), Stage("double", _scale_stage)],
        queue_size=1,
    )
    got = []
    gen = pipe.iter(range(1000))
    for idx, out in gen:
        got.append((idx, float(out[0])))
        if idx == 3:
            break
    gen.close()
    assert got == [(i, 2.0 * i) for i in range(4)]
    assert _threads() == base


def test_stage_workers_run_side_by_side_and_keep_frame_order(no_leak):
    # two workers must be inside fn at once (the barrier needs both), and frames still leave in
    # order although later frames finish first (their delays shrink)
    both = threading.Barrier(2, timeout=10)
    seen_threads = set()
    pipelined = [True]

    def decode(i):
        seen_threads.add(threading.current_thread().name)
        if i < 2 and pipelined[0]:
            both.wait()
        time.sleep(0.002 * (12 - i) / 12)
        return np.full(3, i, np.float32)

    base = _threads()
    pipe = Pipeline(
        [
            Stage("decode", decode, uses_ops=False, workers=2),
            Stage("double", _scale_stage, workers=3),
            Stage("sink", lambda a: a, uses_ops=False),
        ]
    )
    res = pipe.run(range(12))
    assert [float(o[0]) for o in res.outputs] == [2.0 * i for i in range(12)]
    assert res.completed == list(range(12))
    assert seen_threads == {"opsnn-pipeline-decode-0", "opsnn-pipeline-decode-1"}
    st = {s.name: s for s in res.stages}
    assert (st["decode"].workers, st["double"].workers, st["sink"].workers) == (2, 3, 1)
    assert st["decode"].frames == st["double"].frames == 12
    assert res.as_dict()["stages"][0]["workers"] == 2
    assert _threads() == base
    # the sequential baseline ignores workers and gives the same outputs
    pipelined[0] = False
    seq = pipe.run_sequential(range(12))
    assert [float(o[0]) for o in seq.outputs] == [2.0 * i for i in range(12)]


def test_stage_workers_after_frames_dropped_upstream_do_not_wait_for_them(no_leak):
    # a failure upstream drops frames: the multi-worker stage after it gets fewer frames than
    # were read and must neither hang on the missing ones nor reorder the rest
    def flaky(i):
        if i == 4:
            raise ValueError("bad frame 4")
        return i

    pipe = Pipeline(
        [Stage("decode", flaky, uses_ops=False, workers=2), Stage("work", lambda v: v * 10, uses_ops=False, workers=2)],
        queue_size=1,
    )
    with pytest.raises(StageError) as ei:
        pipe.run(range(30))
    res = ei.value.result
    assert (ei.value.stage, ei.value.frame) == ("decode", 4)
    assert res.outputs == [0, 10, 20, 30] and res.failed == {4: "decode"}
    assert res.not_processed == list(range(5, 30))


def test_stage_workers_early_close_stops_every_worker(no_leak):
    base = _threads()
    pipe = Pipeline(
        [Stage("decode", lambda i: i, uses_ops=False, workers=2), Stage("w", lambda v: v, workers=2)], queue_size=1
    )
    gen = pipe.iter(range(1000))
    assert [next(gen)[1] for _ in range(3)] == [0, 1, 2]
    gen.close()
    assert _threads() == base


def _doubler(sizes, delay=0.0):
    """A batched stage fn (list in, list out) that records each call's batch size."""

    def fn(items):
        sizes.append(len(items))
        time.sleep(delay)
        return [ops.mul(opsnn.tensor(a), 2.0).numpy().copy() for a in items]

    return fn


@pytest.mark.parametrize("workers", [1, 2])
def test_batched_stage_takes_the_frames_already_waiting(no_leak, workers):
    # a slow batched stage behind a fast source: each call takes the frames queued meanwhile, at
    # most max_batch; frames keep their order and values, with one worker or two
    sizes = []
    base = _threads()
    pipe = Pipeline(
        [
            Stage("decode", lambda i: np.full(3, i, np.float32), uses_ops=False),
            Stage("work", _doubler(sizes, 0.01), max_batch=3, workers=workers),
            Stage("sink", lambda a: a, uses_ops=False),
        ],
        queue_size=6,
    )
    res = pipe.run(range(40))
    assert [float(o[0]) for o in res.outputs] == [2.0 * i for i in range(40)]
    assert res.completed == list(range(40)) and not res.failed and not res.not_processed
    assert sum(sizes) == 40 and max(sizes) == 3 and min(sizes) >= 1
    assert res.stages[1].frames == 40
    assert _threads() == base
    # run one after another, the stage gets one-item lists
    sizes.clear()
    seq = pipe.run_sequential(range(5))
    assert sizes == [1] * 5 and [float(o[0]) for o in seq.outputs] == [0.0, 2.0, 4.0, 6.0, 8.0]


def test_batched_stage_never_waits_for_a_batch_to_fill(no_leak):
    # the source hands out frame i + 1 only after frame i left the pipeline: a stage that waited
    # for a second frame before calling fn would never get one (the source gives up after 5 s)
    n = 6
    left = [threading.Event() for _ in range(n)]

    def source():
        for i in range(n):
            yield i
            assert left[i].wait(5), f"frame {i} was held back"

    sizes = []
    pipe = Pipeline(
        [
            Stage("decode", lambda i: np.full(2, i, np.float32), uses_ops=False),
            Stage("work", _doubler(sizes), max_batch=4),
            Stage("sink", lambda a: left[int(a[0]) // 2].set() or a, uses_ops=False),
        ]
    )
    res = pipe.run(source())
    assert [float(o[0]) for o in res.outputs] == [2.0 * i for i in range(n)] and sizes == [1] * n


@pytest.mark.parametrize("workers", [1, 2])
def test_batched_stage_failure_names_the_frame_that_raised(no_leak, workers):
    # a batch holding the bad frame fails; its frames run again one per call, so the frames
    # before the bad one finish and the error names the bad one, as without batching
    n, bad = 30, 11
    pool_base = opsnn.memory.current_bytes()
    sizes = []

    def work(items):
        sizes.append(len(items))
        if any(int(a[0]) == bad for a in items):
            raise ValueError("boom")
        time.sleep(0.002)
        return [ops.add(opsnn.tensor(a), 1.0).numpy().copy() for a in items]

    base = _threads()
    pipe = Pipeline(
        [
            Stage("decode", lambda i: np.full(4, i, np.float32), uses_ops=False),
            Stage("work", work, max_batch=3, workers=workers),
        ],
        queue_size=6,
    )
    with pytest.raises(StageError) as ei:
        pipe.run(range(n))
    err, res = ei.value, ei.value.result
    assert (err.stage, err.frame) == ("work", bad) and isinstance(err.cause, ValueError)
    assert res.failed == {bad: "work"} and res.completed == list(range(bad))
    assert [int(o[0]) for o in res.outputs] == [i + 1 for i in range(bad)]
    assert res.not_processed == list(range(bad + 1, n))
    assert max(sizes) > 1  # batches did form
    del err, res, ei
    assert _threads() == base
    gc.collect()
    assert opsnn.memory.current_bytes() == pool_base

    # a batch that fails while each of its frames passes alone: the frames' own outputs
    def only_alone(items):
        if len(items) > 1:
            raise MemoryError("batch too large")
        return [items[0] * 2]

    res = Pipeline(
        [Stage("decode", lambda i: i, uses_ops=False), Stage("work", only_alone, uses_ops=False, max_batch=4)],
        queue_size=4,
    ).run(range(20))
    assert res.outputs == [2 * i for i in range(20)] and not res.failed


def test_batched_stage_must_return_one_output_per_frame(no_leak):
    for fn, said in (
        (lambda items: items + items, "it got 1 and returned 2"),
        (lambda items: np.zeros(len(items)), "it got 1 and returned a ndarray"),
    ):
        pipe = Pipeline([Stage("decode", lambda i: i, uses_ops=False), Stage("work", fn, uses_ops=False, max_batch=2)])
        with pytest.raises(StageError) as ei:
            pipe.run(range(4))
        assert ei.value.stage == "work" and isinstance(ei.value.cause, ParamInvalidError)
        assert "(max_batch=2): fn must return a list of one output per payload" in str(ei.value.cause)
        with pytest.raises(StageError) as ei:  # one after another: one-item lists
            pipe.run_sequential(range(3))
        assert (ei.value.frame, str(ei.value.cause).endswith(said)) == (0, True)
        del ei


# -- failures ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch", [None, 3])
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("where", ["decode", "pre", "infer", "post"])
def test_crashed_stage_surfaces_typed_error_and_cleans_up(no_leak, where, workers, batch):
    n, bad = 20, 7
    pool_base = opsnn.memory.current_bytes()

    def stage(name, uses_ops=True):
        def fn(x):
            i = int(x[0]) if not isinstance(x, int) else x
            if name == where and i == bad:
                raise ValueError(f"boom in {name}")
            if isinstance(x, int):
                return np.full(1024, x, np.float32)
            return ops.add(opsnn.tensor(x), 0.0).numpy().copy() if uses_ops else x

        if batch is None or name == "decode":
            return Stage(name, fn, uses_ops=uses_ops, workers=workers)
        return Stage(name, lambda xs: [fn(x) for x in xs], uses_ops=uses_ops, workers=workers, max_batch=batch)

    base = _threads()
    pipe = Pipeline([stage("decode", False), stage("pre"), stage("infer"), stage("post")], queue_size=2)
    with pytest.raises(StageError) as ei:
        pipe.run(range(n))
    err = ei.value
    assert err.stage == where and err.frame == bad
    assert isinstance(err.cause, ValueError) and f"boom in {where}" in str(err)
    assert f"stage {where!r} failed on frame {bad}" in str(err)
    assert isinstance(err, opsnn.errors.OpsnnRuntimeError)
    res = err.result
    assert res.completed == list(range(bad))  # frames before the failure finished
    assert [int(o[0]) for o in res.outputs] == list(range(bad))
    assert res.failed == {bad: where}
    assert res.not_processed == list(range(bad + 1, n))  # the rest are reported, not lost
    assert sorted(res.completed + list(res.failed) + res.not_processed) == list(range(n))
    del err, res, ei
    assert _threads() == base
    gc.collect()
    assert opsnn.memory.current_bytes() == pool_base


def test_iter_raises_after_the_completed_frames(no_leak):
    def fn(i):
        if i == 3:
            raise RuntimeError("bad frame")
        return i

    pipe = Pipeline([Stage("decode", lambda i: i, uses_ops=False), Stage("work", fn)])
    got = []
    with pytest.raises(StageError) as ei:
        for _idx, out in pipe.iter(range(10)):
            got.append(out)
    assert got == [0, 1, 2] and (ei.value.stage, ei.value.frame) == ("work", 3)
    assert ei.value.result.not_processed == list(range(4, 10))


def test_source_error_and_unsized_source(no_leak):
    def source():
        yield 0
        yield 1
        raise OSError("disk gone")

    pipe = Pipeline([Stage("decode", lambda i: i, uses_ops=False), Stage("post", lambda v: v * 10, uses_ops=False)])
    with pytest.raises(StageError) as ei:
        pipe.run(source())
    assert ei.value.stage == "decode" and ei.value.frame == 2 and isinstance(ei.value.cause, OSError)
    assert ei.value.result.outputs == [0, 10]
    with pytest.raises(StageError) as ei:
        pipe.run_sequential(source())
    assert (ei.value.stage, ei.value.frame, ei.value.result.outputs) == ("decode", 2, [0, 10])


def test_kernel_error_on_a_stage_stream_is_that_stages_error(no_leak):
    data = opsnn.tensor(np.arange(4, dtype=np.float32))

    def gather(i):
        idx = opsnn.tensor(np.array([i], np.int64))  # index 4+ is out of range: the kernel raises
        return ops.gather(data, idx, 0).numpy().copy()

    base = _threads()
    pipe = Pipeline([Stage("decode", lambda i: i, uses_ops=False), Stage("lookup", gather)])
    with pytest.raises(StageError) as ei:
        pipe.run(range(8))
    assert ei.value.stage == "lookup" and ei.value.frame == 4
    assert isinstance(ei.value.cause, ParamInvalidError) and "out of range" in str(ei.value)
    assert ei.value.result.not_processed == [5, 6, 7]
    assert _threads() == base


def test_consumer_error_stops_threads(no_leak):
    base = _threads()
    pipe = Pipeline(
        [Stage("decode", lambda i: np.zeros(8, np.float32) + i, uses_ops=False), Stage("double", _scale_stage)],
        queue_size=1,
    )

    def callback(i, out):
        if i == 2:
            raise KeyError("consumer")

    with pytest.raises(KeyError):
        pipe.run(range(100), on_output=callback)
    assert _threads() == base


def test_blas_threads_set_during_a_pipelined_run_and_restored(no_leak):
    from opsnn.runtime.blas import blas_threads, get_blas_threads

    before = get_blas_threads()
    if before is None:
        pytest.skip("numpy's BLAS is not OpenBLAS")
    seen = []
    pipe = Pipeline([Stage("probe", lambda i: seen.append(get_blas_threads()) or i, uses_ops=False)], blas_threads=1)
    pipe.run(range(3))
    assert seen == [1, 1, 1] and get_blas_threads() == before
    seen.clear()
    pipe.run_sequential(range(2), blas_threads=1)
    assert seen == [1, 1] and get_blas_threads() == before
    with blas_threads(1):
        with blas_threads(1):
            assert get_blas_threads() == 1
        assert get_blas_threads() == 1
    assert get_blas_threads() == before
    with pytest.raises(StageError):  # restored after a failed run too
        Pipeline([Stage("x", lambda i: 1 / 0, uses_ops=False)], blas_threads=1).run(range(2))
    assert get_blas_threads() == before


def test_bad_pipeline_arguments():
    with pytest.raises(ParamInvalidError):
        Pipeline([])
    with pytest.raises(ParamInvalidError):
        Pipeline([Stage("a", abs), Stage("a", abs)])
    with pytest.raises(ParamInvalidError):
        Pipeline([Stage("a", abs)], queue_size=0)
    with pytest.raises(ParamInvalidError):
        Pipeline([abs])
    with pytest.raises(ParamInvalidError):
        Stage("a", 3)
    with pytest.raises(ParamInvalidError):
        Stage("", abs)
    with pytest.raises(ParamInvalidError, match="workers must be an int >= 1"):
        Stage("a", abs, workers=0)
    for bad in (0, -1, True, "2", 1.5):
        with pytest.raises(ParamInvalidError, match="max_batch must be an int >= 1 or None"):
            Stage("a", abs, max_batch=bad)
    with pytest.raises(ParamInvalidError, match="first stage .* reads the source one item at a time"):
        Pipeline([Stage("a", abs, max_batch=2), Stage("b", abs)])
    with pytest.raises(ParamInvalidError, match="blas_threads"):
        Pipeline([Stage("a", abs)], blas_threads=0)
    base = _threads()
    pipe = Pipeline([Stage("a", abs, uses_ops=False)])
    with pytest.raises(ParamInvalidError, match="iterable"):
        pipe.run(5)
    with pytest.raises(ParamInvalidError, match="iterable"):
        pipe.run_sequential(5)
    assert pipe.run([]).outputs == [] and pipe.run_sequential([]).outputs == []
    assert _threads() == base


# -- sources ---------------------------------------------------------------------------------------------------
def test_synthetic_video_is_deterministic_and_moves():
    src = SyntheticVideo(3, height=24, width=40, seed=5)
    frames = [src.decode(p) for p in src]
    assert len(src) == 3 and frames[0].shape == (24, 40, 3) and frames[0].dtype == np.uint8
    np.testing.assert_array_equal(frames[1], synth_frame(1, 24, 40, 5))
    assert not np.array_equal(frames[0], frames[1])
    with pytest.raises(ParamInvalidError):
        SyntheticVideo(-1)
    with pytest.raises(ParamInvalidError):
        SyntheticVideo(2, height=0)


def test_npy_and_png_folders_round_trip(tmp_path):
    frames = [synth_frame(i, 20, 28) for i in range(3)]
    write_image_folder(str(tmp_path / "npy"), frames, fmt="npy")
    src = ImageFolder(str(tmp_path / "npy"))
    assert len(src) == 3
    for f, p in zip(frames, src):
        np.testing.assert_array_equal(src.decode(p), f)
    if have_png_support():
        write_image_folder(str(tmp_path / "png"), frames, fmt="png")
        src = ImageFolder(str(tmp_path / "png"))
        for f, p in zip(frames, src):
            np.testing.assert_array_equal(src.decode(p), f)  # PNG is lossless
    with pytest.raises(ParamInvalidError):
        ImageFolder(str(tmp_path / "missing"))
    with pytest.raises(ParamInvalidError):
        write_image_folder(str(tmp_path / "x"), frames, fmt="jpg")
    np.save(tmp_path / "npy" / "frame_000009.npy", np.zeros((4, 4), np.float32))
    with pytest.raises(ParamInvalidError, match="expected"):
        ImageFolder(str(tmp_path / "npy")).decode(str(tmp_path / "npy" / "frame_000009.npy"))


@pytest.mark.skipif(not have_video_support(), reason="PyAV (av) not installed")
def test_video_file_round_trip(tmp_path):
    frames = [synth_frame(10 * i, 48, 64) for i in range(6)]
    path = write_video(str(tmp_path / "v.mp4"), frames, quality=10)
    src = VideoFile(path)
    assert (src.height, src.width, len(src)) == (48, 64, 6)
    got = [src.decode(p) for p in src]
    assert len(got) == 6 and all(g.shape == (48, 64, 3) and g.dtype == np.uint8 for g in got)
    for i, g in enumerate(got):  # lossy H.264 (4:2:0 chroma): each frame is nearest its own original
        err = [np.abs(g.astype(int) - f.astype(int)).mean() for f in frames]
        assert int(np.argmin(err)) == i and err[i] < 20
    threaded = VideoFile(path, threads=2)  # frame threading decodes ahead; the frames are the same
    for g, p in zip(got, threaded, strict=True):
        np.testing.assert_array_equal(threaded.decode(p), g)
    with pytest.raises(ParamInvalidError):
        VideoFile(str(tmp_path / "none.mp4"))
    (tmp_path / "junk.mp4").write_bytes(b"not a video")
    with pytest.raises(ParamInvalidError):
        VideoFile(str(tmp_path / "junk.mp4"))
    with pytest.raises(ParamInvalidError, match="threads must be an int >= 1"):
        VideoFile(path, threads=0)
    with pytest.raises(ParamInvalidError, match="packet must be a frame"):
        src.decode(np.zeros((48, 64, 3), np.uint8))
    with pytest.raises(ParamInvalidError):
        write_video(str(tmp_path / "e.mp4"), [])
    with pytest.raises(ParamInvalidError, match="even height and width"):
        write_video(str(tmp_path / "odd.mp4"), [np.zeros((48, 63, 3), np.uint8)])
    with pytest.raises(ParamInvalidError, match="quality must be"):
        write_video(str(tmp_path / "q.mp4"), frames, quality=11)
    with pytest.raises(ParamInvalidError, match="frame 1 has shape"):
        write_video(str(tmp_path / "s.mp4"), [frames[0], frames[0][:32]])


@pytest.mark.skipif(not have_video_support(), reason="PyAV (av) not installed")
def test_video_file_damage(tmp_path):
    """A cut-off file fails when opened; damage mid-stream fails the decode stage at the frame
    it hits, after the frames before it went through every stage."""
    path = write_video(str(tmp_path / "v.mp4"), [synth_frame(i, 48, 64) for i in range(30)])
    data = open(path, "rb").read()
    (tmp_path / "cut.mp4").write_bytes(data[: len(data) * 6 // 10])  # the index (moov) is at the end
    with pytest.raises(ParamInvalidError, match="not a readable video"):
        VideoFile(str(tmp_path / "cut.mp4"))
    bad = bytearray(data)
    bad[len(data) // 2 : len(data) // 2 + 400] = np.random.default_rng(0).integers(0, 256, 400, np.uint8).tobytes()
    (tmp_path / "bad.mp4").write_bytes(bytes(bad))
    src = VideoFile(str(tmp_path / "bad.mp4"))
    with pytest.raises(ParamInvalidError, match="decoding failed after"):
        for _ in src:
            pass
    pipe = Pipeline(
        [Stage("decode", src.decode, uses_ops=False), Stage("mean", lambda f: float(f.mean()), uses_ops=False)]
    )
    for run in (pipe.run, pipe.run_sequential):
        with pytest.raises(StageError) as ei:
            run(src)
        assert ei.value.stage == "decode" and isinstance(ei.value.cause, ParamInvalidError)
        n = ei.value.frame
        assert 0 < n < 30 and ei.value.result.completed == list(range(n))


# -- the video classification pipeline ---------------------------------------------------------------------------
def _np_bilinear(img, size):
    """Half-pixel bilinear resize of (C, H, W) (no antialias), as torch's align_corners=False."""
    c, h, w = img.shape

    def axis(n_in, n_out):
        x = (np.arange(n_out) + 0.5) * n_in / n_out - 0.5
        x = np.clip(x, 0, None)
        i0 = np.minimum(np.floor(x).astype(int), n_in - 1)
        i1 = np.minimum(i0 + 1, n_in - 1)
        return i0, i1, x - i0

    y0, y1, fy = axis(h, size)
    x0, x1, fx = axis(w, size)
    top = img[:, y0][:, :, x0] * (1 - fx) + img[:, y0][:, :, x1] * fx
    bot = img[:, y1][:, :, x0] * (1 - fx) + img[:, y1][:, :, x1] * fx
    return top * (1 - fy)[:, None] + bot * fy[:, None]


def test_video_pipeline_matches_numpy_preprocess_and_direct_model(no_leak):
    src = SyntheticVideo(6, height=40, width=56)
    size = 32
    cg = build_model("smallnet", size, num_classes=10)
    pipe = video_pipeline(src, model=cg, image_size=size, top_k=3)
    res = pipe.run(src)
    assert [s.name for s in res.stages] == ["decode", "preprocess", "infer", "postprocess"]
    for i, out in enumerate(res.outputs):
        frame = src.decode(i).astype(np.float64).transpose(2, 0, 1)
        x = (_np_bilinear(frame, size) - MEAN[:, None, None]) / STD[:, None, None]
        logits = cg.run([x[None].astype(np.float32)])[0].numpy()[0].astype(np.float64)
        p = np.exp(logits - logits.max())
        p /= p.sum()
        order = np.argsort(-p, kind="stable")[:3]
        assert out["top"][0] == order[0]
        np.testing.assert_allclose(out["prob"], p[out["top"]], rtol=1e-3, atol=1e-5)
        np.testing.assert_allclose(sorted(out["prob"], reverse=True), p[order], rtol=1e-3, atol=1e-5)
    seq = pipe.run_sequential(src)
    assert [o["top"] for o in seq.outputs] == [o["top"] for o in res.outputs]
    # two decode workers: the same outputs, in the same order
    two = video_pipeline(src, model=cg, image_size=size, top_k=3, decode_workers=2)
    assert two.stages[0].workers == 2
    assert two.run(src).outputs == res.outputs
    # inference on one and on three compiled copies: the same outputs, in the same order
    one = video_pipeline(src, model=cg, image_size=size, top_k=3, infer_workers=1)
    three = video_pipeline(src, model=cg, image_size=size, top_k=3, infer_workers=3)
    assert (one.stages[2].workers, three.stages[2].workers) == (1, 3)
    assert (one.queue_size, three.queue_size) == (2, 4)  # default: a frame ready for every worker, and one more
    assert one.run(src).outputs == res.outputs == three.run(src).outputs
    # up to two frames per model call: the same classes, probabilities to float32 rounding
    # (a batch of two may take other kernels' summation order)
    assert pipe.stages[2].max_batch == 1  # a compiled model passed in: one frame a call unless asked
    two = video_pipeline(src, model=cg, image_size=size, top_k=3, infer_batch=2)
    assert two.stages[2].max_batch == 2
    for r in (two.run(src), two.run_sequential(src)):
        assert [o["top"] for o in r.outputs] == [o["top"] for o in res.outputs]
        np.testing.assert_allclose([o["prob"] for o in r.outputs], [o["prob"] for o in res.outputs], rtol=1e-5)
    infer = two.stages[2].fn  # a batch of two, whatever the timing of the run above
    xs = [pipe.stages[1].fn(src.decode(i)) for i in (1, 4)]
    pair = infer(xs)
    assert len(pair) == 2 and all(y.shape == (1, 10) for y in pair)
    for x, y in zip(xs, pair):
        np.testing.assert_allclose(y.numpy(), infer([x])[0].numpy(), rtol=1e-5, atol=1e-6)


def test_replicas_run_side_by_side_with_buffers_of_their_own(no_leak):
    cg = build_model("smallnet", 16, num_classes=5)
    rep = cg.replica()
    assert rep.graph is cg.graph and rep._weights is cg._weights  # the weights are shared, not copied
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((1, 3, 16, 16)).astype(np.float32) for _ in range(8)]
    want = [cg.run([x])[0].numpy().copy() for x in xs]
    got: dict = {}

    def worker(model, idx):
        with opsnn.Stream(name=f"replica-{idx[0]}"):  # a stream each, as pipeline workers have
            for i in idx:
                for _ in range(3):  # both replicas busy at the same time, many times over
                    got[i] = model.run([xs[i]])[0].numpy().copy()

    ts = [threading.Thread(target=worker, args=(m, range(k, 8, 2))) for k, m in enumerate((cg, rep))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for i in range(8):
        np.testing.assert_array_equal(got[i], want[i])


def test_video_pipeline_bad_frames_and_arguments(tmp_path, no_leak):
    src = SyntheticVideo(4, height=24, width=32)
    cg = build_model("smallnet", 16, num_classes=4)
    with pytest.raises(ParamInvalidError):
        video_pipeline(src, model=cg, image_size=16, top_k=5)  # more than 4 classes
    with pytest.raises(ParamInvalidError):
        video_pipeline([1, 2], model=cg, image_size=16)
    with pytest.raises(ParamInvalidError):
        build_model("vgg", 32)
    with pytest.raises(ParamInvalidError, match="decode_workers must be an int >= 1"):
        video_pipeline(src, model=cg, image_size=16, top_k=2, decode_workers=0)
    with pytest.raises(ParamInvalidError, match="infer_workers must be an int >= 1"):
        video_pipeline(src, model=cg, image_size=16, top_k=2, infer_workers=0)
    with pytest.raises(ParamInvalidError, match="infer_batch must be an int >= 1"):
        video_pipeline(src, model=cg, image_size=16, top_k=2, infer_batch=0)
    static = opsnn.compile(
        opsnn.models.SmallConvNet(num_classes=4, image_size=16), [np.zeros((1, 3, 16, 16), np.float32)]
    )
    with pytest.raises(ParamInvalidError, match="infer_batch=2 needs a model whose batch dimension may change"):
        video_pipeline(src, model=static, image_size=16, top_k=2, infer_batch=2)
    assert video_pipeline(src, model=static, image_size=16, top_k=2).stages[2].max_batch == 1
    assert video_pipeline(src, model="smallnet", image_size=16, top_k=2).stages[2].max_batch == 2  # built by name

    class Sequential(SyntheticVideo):  # a source that decodes in sequence (like a video file)
        independent_frames = False

    with pytest.raises(ParamInvalidError, match="decodes frames in sequence"):
        video_pipeline(Sequential(2, 24, 32), model=cg, image_size=16, top_k=2, decode_workers=2)
    # a folder whose third frame has another size: decode fails on frame 2, naming the stage
    frames = [synth_frame(i, 24, 32) for i in range(4)]
    frames[2] = synth_frame(2, 20, 32)
    write_image_folder(str(tmp_path / "f"), frames, fmt="npy")
    folder = ImageFolder(str(tmp_path / "f"))
    pipe = video_pipeline(folder, model=cg, image_size=16, top_k=2, frame_shape=(24, 32, 3))
    with pytest.raises(StageError) as ei:
        pipe.run(folder)
    assert (ei.value.stage, ei.value.frame) == ("decode", 2)
    assert ei.value.result.completed == [0, 1] and ei.value.result.not_processed == [3]


@pytest.mark.skipif(not have_video_support(), reason="PyAV (av) not installed")
def test_video_bench_on_a_video_file_compares_best_settings():
    """A video file is timed with one and two decoding threads in both modes; each mode is
    represented by its fastest setting and the ratio is theirs."""
    rep = video_bench(frames=6, model="smallnet", image_size=24, height=32, width=48, source="video", repeat=1)
    fps = rep["fps_by_mode"]
    assert {"sequential", "sequential_decode2", "pipelined", "pipelined_decode2"} <= set(fps)
    seq = [k for k in fps if k.startswith("sequential")]
    pipe = [k for k in fps if k.startswith("pipelined")]
    assert rep["sequential_baseline"] == max(seq, key=fps.get) and rep["pipelined_best"] == max(pipe, key=fps.get)
    assert rep["ratio"] == pytest.approx(fps[rep["pipelined_best"]] / fps[rep["sequential_baseline"]], rel=1e-2)
    assert rep["outputs_match"]  # the same frames whatever the decoding threads
    assert "<- best pipelined" in format_report(rep)


def test_video_bench_and_cli(tmp_path, capsys):
    rep = video_bench(frames=6, model="smallnet", image_size=24, height=32, width=48, source="synthetic", repeat=1)
    assert rep["outputs_match"] and rep["sequential_fps"] > 0 and rep["pipelined_fps"] > 0
    assert rep["ratio"] == pytest.approx(rep["pipelined_fps"] / rep["sequential_fps"], rel=1e-2)
    assert [s["stage"] for s in rep["pipelined"]["stages"]] == ["decode", "preprocess", "infer", "postprocess"]
    # two frames a call by default; the same pipeline one frame a call is timed too
    assert rep["workload"]["infer_batch"] == 2 and {"pipelined", "pipelined_batch1"} <= set(rep["fps_by_mode"])
    out = tmp_path / "v.json"
    rc = cli_video_bench(
        [
            "--frames",
            "4",
            "--model",
            "smallnet",
            "--image-size",
            "16",
            "--height",
            "24",
            "--width",
            "32",
            "--source",
            "npy",
            "--repeat",
            "1",
            "--decode-workers",
            "2",
            "--infer-workers",
            "2",
            "--infer-batch",
            "1",
            "--json",
            str(out),
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0 and "frames/s" in text and "the frames/s of sequential" in text and "preprocess" in text
    assert "2 decode workers" in text and "target" not in text
    assert "2 infer workers of up to 1 frame a call" in text and "pipelined_batch1" not in text
    rep = json.loads(out.read_text())
    assert rep["workload"]["source"] == "npy" and rep["workload"]["decode_workers"] == 2
    assert rep["pipelined"]["stages"][0]["workers"] == 2 and rep["workload"]["infer_workers"] == 2
    assert cli_video_bench(["--frames", "0"]) == 2
    assert os.path.exists(out)
