"""Video pipeline benchmark: decode -> preprocess -> infer -> postprocess, each stage on its own
thread (and opsnn Stream), vs the same four stages one after another on the same model and frames.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/video.py [--json out.json]

Prints frames/s of both modes, their ratio (target: pipelined >= 1.5x sequential) and per-stage
busy / wait times, and writes them as JSON (default bench/results/video.json). Frames come from
an H.264 file written for the run when PyAV (av) is installed (``pip install -e .[video]``),
else from synthesized frames. The overlap on few cores comes from kernels (numba ``nogil``, BLAS)
and numpy releasing the GIL while other stages run Python; the report also gives each mode's
process CPU time / wall time (how many cores it kept busy) and the machine's load average, since
other processes on the machine take cores from both modes.
"""

from __future__ import annotations

import sys

from workloads import write_json

from opsnn.pipeline.video import _parser, format_report, video_bench


def main(argv=None) -> int:
    ap = _parser("bench/video.py")
    ap.set_defaults(json="bench/results/video.json")
    args = ap.parse_args(argv)
    rep = video_bench(
        frames=args.frames,
        model=args.model,
        image_size=args.image_size,
        height=args.height,
        width=args.width,
        source=args.source,
        queue_size=args.queue_size,
        repeat=args.repeat,
        log=lambda m: print(m, file=sys.stderr),
    )
    rep["benchmark"] = "video"
    print(format_report(rep))
    print()
    write_json(rep, args.json, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
