"""Streaming pipelines and large-image tiling on top of opsnn's streams and compiled graphs.

- :class:`Pipeline` / :class:`Stage`: stages on their own threads and streams, bounded queues,
  frames in order, per-stage timings, failures reported as :class:`StageError`.
- :func:`video_pipeline` / :func:`video_bench` / :func:`cli_video_bench`: video classification
  (decode -> preprocess -> infer -> postprocess) and its pipelined-vs-sequential benchmark.
- :mod:`~opsnn.pipeline.sources`: synthesized frames, local video files, image folders.
- :func:`tiled` / :class:`TiledExecutor`: run a conv stack on a huge image tile by tile with a
  halo from its receptive field, equal to the untiled result, in bounded memory.

>>> import numpy as np
>>> from opsnn.pipeline import Pipeline, Stage
>>> Pipeline([Stage("inc", lambda v: v + 1, uses_ops=False)]).run([1, 2]).outputs
[2, 3]
"""

from .engine import Pipeline, PipelineResult, Stage, StageError, StageStats
from .sources import ImageFolder, SyntheticVideo, VideoFile, synth_frame, write_image_folder, write_video
from .tiling import ReceptiveField, TiledExecutor, receptive_field, tiled
from .video import cli_video_bench, format_report, video_bench, video_pipeline

__all__ = [
    "ImageFolder",
    "Pipeline",
    "PipelineResult",
    "ReceptiveField",
    "Stage",
    "StageError",
    "StageStats",
    "SyntheticVideo",
    "TiledExecutor",
    "VideoFile",
    "cli_video_bench",
    "format_report",
    "receptive_field",
    "synth_frame",
    "tiled",
    "video_bench",
    "video_pipeline",
    "write_image_folder",
    "write_video",
]
