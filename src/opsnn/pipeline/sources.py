"""Frame sources for the video pipeline: synthesized frames, a local video file, an image folder.

A source is an iterable of *packets* (cheap to produce: a frame index, an encoded chunk, a
file path) plus ``decode(packet) -> (H, W, 3) uint8 array``: the pipeline's decode stage.
Splitting read from decode keeps the decoding work on the decode stage's thread::

    >>> from opsnn.pipeline.sources import SyntheticVideo
    >>> src = SyntheticVideo(num_frames=3, height=48, width=64)
    >>> [src.decode(p).shape for p in src]
    [(48, 64, 3), (48, 64, 3), (48, 64, 3)]

Video files use PyAV (``av``: a wheel that ships FFmpeg's libraries, libx264 included) and PNG
folders use Pillow; both are optional (``pip install opsnn[video]``): without them use
:class:`SyntheticVideo` or a folder of ``.npy`` frames.
"""

from __future__ import annotations

import os
from fractions import Fraction

import numpy as np

from ..errors import ParamInvalidError


def _check_dims(who: str, height, width) -> tuple[int, int]:
    for n, v in (("height", height), ("width", width)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ParamInvalidError(f"{who}: {n} must be a positive int, got {v!r}")
    return int(height), int(width)


def synth_frame(index: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    """Frame ``index`` of a deterministic moving test pattern (gradients, a moving disc,
    seeded sensor-like noise of 0-3 levels), ``(height, width, 3)`` uint8. The noise is kept low
    so that an H.264 encoding of it has a realistic bit rate and decoding cost
    (docs/performance.md, "Video pipeline")."""
    y = np.arange(height, dtype=np.float32)[:, None]
    x = np.arange(width, dtype=np.float32)[None, :]
    t = float(index)
    r = 127.5 + 127.5 * np.sin((x + 3 * t) * (2 * np.pi / max(width, 1)))
    g = 127.5 + 127.5 * np.cos((y - 2 * t) * (2 * np.pi / max(height, 1)))
    cy, cx = height / 2 + height / 4 * np.sin(t / 7), width / 2 + width / 4 * np.cos(t / 5)
    disc = ((y - cy) ** 2 + (x - cx) ** 2) < (min(height, width) / 6) ** 2
    b = np.where(disc, 255.0, 40.0)
    noise = np.random.default_rng((seed, index)).integers(0, 4, (height, width, 3), dtype=np.uint8)  # see the docstring
    frame = np.stack([r + 0 * y, g + 0 * x, b], axis=-1).astype(np.uint8)
    np.add(frame, noise, out=frame, casting="unsafe")
    return frame


class SyntheticVideo:
    """``num_frames`` frames of :func:`synth_frame`; packets are frame indices and decoding
    renders the frame (a stand-in for a codec's per-frame work). Frames are independent of
    each other, so several decode workers may render them at once."""

    independent_frames = True

    def __init__(self, num_frames: int, height: int = 480, width: int = 640, seed: int = 0):
        if not isinstance(num_frames, (int, np.integer)) or num_frames < 0:
            raise ParamInvalidError(f"SyntheticVideo: num_frames must be an int >= 0, got {num_frames!r}")
        self.num_frames = int(num_frames)
        self.height, self.width = _check_dims("SyntheticVideo", height, width)
        self.seed = seed

    def __len__(self) -> int:
        return self.num_frames

    def __iter__(self):
        return iter(range(self.num_frames))

    def decode(self, packet) -> np.ndarray:
        return synth_frame(packet, self.height, self.width, self.seed)

    def __repr__(self) -> str:
        return f"SyntheticVideo({self.num_frames} frames, {self.width}x{self.height})"


def _av():
    try:
        import av
    except ImportError:
        raise ParamInvalidError(
            "video files need the 'av' package (PyAV: pip install av, or opsnn[video]); "
            "use SyntheticVideo or an image folder instead"
        ) from None
    return av


def have_video_support() -> bool:
    """True when PyAV (``av``) is importable (video files can be written and read)."""
    try:
        import av  # noqa: F401
    except ImportError:
        return False
    return True


def have_png_support() -> bool:
    """True when Pillow is importable (PNG folders can be written and read)."""
    try:
        import PIL.Image  # noqa: F401
    except ImportError:
        return False
    return True


def write_video(path: str, frames, fps: float = 30.0, quality: int = 7) -> str:
    """Encode ``(H, W, 3)`` uint8 frames into an H.264 (libx264, yuv420p) video at ``path`` with PyAV.
    ``quality`` 0..10 maps to x264's constant rate factor ``round(51 * (1 - quality / 10))``
    (7: CRF 15; 10: lossless luma). 4:2:0 chroma needs an even height and width."""
    av = _av()
    if isinstance(quality, bool) or not isinstance(quality, (int, float)) or not 0 <= quality <= 10:
        raise ParamInvalidError(f"write_video: quality must be a number in 0..10, got {quality!r}")
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not fps > 0:
        raise ParamInvalidError(f"write_video: fps must be a positive number, got {fps!r}")
    container = stream = shape = None
    n = 0
    try:
        for f in frames:
            f = np.ascontiguousarray(f)
            if f.ndim != 3 or f.shape[2] != 3 or f.dtype != np.uint8:
                raise ParamInvalidError(f"write_video: frames must be (H, W, 3) uint8, got {f.shape} {f.dtype}")
            if shape is None:
                if f.shape[0] % 2 or f.shape[1] % 2:
                    raise ParamInvalidError(
                        f"write_video: H.264 4:2:0 needs an even height and width, frame 0 is "
                        f"{f.shape[0]}x{f.shape[1]} (crop or pad it by one pixel)"
                    )
                shape = f.shape
                container = av.open(path, "w")
                stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
                stream.height, stream.width = shape[:2]
                stream.pix_fmt = "yuv420p"
                stream.options = {"crf": str(round(51 * (1 - quality / 10)))}
            elif f.shape != shape:
                raise ParamInvalidError(f"write_video: frame {n} has shape {f.shape}, frame 0 had {shape}")
            container.mux(stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")))
            n += 1
        if stream is not None:
            container.mux(stream.encode(None))  # flush the encoder's delayed frames
    finally:
        if container is not None:
            container.close()
    if n == 0:
        raise ParamInvalidError("write_video: no frames given")
    return path


class VideoFile:
    """Frames of a local video file, decoded in this process by FFmpeg's libavcodec (PyAV).

    Iterating demuxes and decodes (a packet is one decoded, still YUV, frame); ``decode(packet)``
    converts it to an ``(H, W, 3)`` RGB array. Both run on the pipeline's decode stage, which
    reads the source: decoding is that stage's work in a pipelined and in a sequential run alike.
    ``threads``: libavcodec's decoding threads. 1 (default) decodes each frame when it is read;
    more use frame threading, which decodes later frames in the background, outside any stage.
    ``len()`` is the container's frame count (exact for files written by :func:`write_video`).
    A missing or unreadable file raises ``ParamInvalidError`` here; damage found while decoding
    raises it from the iteration (a pipeline reports it as the decode stage's error). Frames
    decode in sequence: one decode worker."""

    independent_frames = False

    def __init__(self, path: str, threads: int = 1):
        av = _av()
        if not os.path.isfile(path):
            raise ParamInvalidError(f"VideoFile: no such file {path!r}")
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ParamInvalidError(f"VideoFile: threads must be an int >= 1, got {threads!r}")
        self.path = path
        self.threads = threads
        self._av = av
        try:
            with av.open(path) as container:
                if not container.streams.video:
                    raise ParamInvalidError(f"VideoFile: {path!r} has no video stream")
                stream = container.streams.video[0]
                self.width, self.height = stream.codec_context.width, stream.codec_context.height
                self.fps = float(stream.average_rate or 0.0)
                self.num_frames = int(stream.frames) or None
        except av.FFmpegError as exc:
            raise ParamInvalidError(f"VideoFile: {path!r} is not a readable video: {exc}") from None
        if not self.width or not self.height:
            raise ParamInvalidError(f"VideoFile: {path!r}: the video stream has no frame size")

    def __len__(self) -> int:
        if self.num_frames is None:
            raise TypeError("VideoFile: frame count unknown")
        return self.num_frames

    def __iter__(self):
        av = self._av
        n = 0
        try:
            with av.open(self.path) as container:
                stream = container.streams.video[0]
                stream.thread_type = "FRAME" if self.threads > 1 else "SLICE"
                stream.thread_count = self.threads
                for frame in container.decode(stream):
                    yield frame
                    n += 1
        except av.FFmpegError as exc:
            raise ParamInvalidError(f"VideoFile {self.path!r}: decoding failed after {n} frames: {exc}") from None

    def decode(self, packet) -> np.ndarray:
        if not isinstance(packet, self._av.VideoFrame):
            raise ParamInvalidError(
                f"VideoFile.decode: packet must be a frame from iterating the VideoFile, got {type(packet).__name__}"
            )
        if (packet.height, packet.width) != (self.height, self.width):
            raise ParamInvalidError(
                f"VideoFile {self.path!r}: a frame is {packet.height}x{packet.width}, expected "
                f"{self.height}x{self.width}"
            )
        return packet.to_ndarray(format="rgb24")

    def __repr__(self) -> str:
        return f"VideoFile({self.path!r}, {self.num_frames} frames, {self.width}x{self.height})"


def write_image_folder(directory: str, frames, fmt: str = "png") -> list[str]:
    """Write frames as ``frame_000000.png`` (Pillow) or ``.npy`` files into ``directory``."""
    if fmt not in ("png", "npy"):
        raise ParamInvalidError(f"write_image_folder: fmt must be 'png' or 'npy', got {fmt!r}")
    if fmt == "png" and not have_png_support():
        raise ParamInvalidError("write_image_folder: PNG needs Pillow (pip install pillow); use fmt='npy'")
    os.makedirs(directory, exist_ok=True)
    paths = []
    for i, f in enumerate(frames):
        f = np.ascontiguousarray(f)
        if f.ndim != 3 or f.shape[2] != 3 or f.dtype != np.uint8:
            raise ParamInvalidError(f"write_image_folder: frames must be (H, W, 3) uint8, got {f.shape} {f.dtype}")
        p = os.path.join(directory, f"frame_{i:06d}.{fmt}")
        if fmt == "png":
            from PIL import Image

            Image.fromarray(f).save(p, compress_level=1)
        else:
            np.save(p, f)
        paths.append(p)
    return paths


class ImageFolder:
    """The ``.png`` / ``.npy`` frames of a folder, in file-name order. Packets are paths;
    ``decode`` reads one (PNG through Pillow) and checks it is ``(H, W, 3)`` uint8 (grey and
    RGBA PNGs are converted to RGB). Files decode independently: several decode workers may
    read them at once."""

    independent_frames = True
    EXTENSIONS = (".png", ".npy")

    def __init__(self, directory: str):
        if not os.path.isdir(directory):
            raise ParamInvalidError(f"ImageFolder: no such directory {directory!r}")
        self.directory = directory
        self.paths = sorted(
            os.path.join(directory, f) for f in os.listdir(directory) if f.lower().endswith(self.EXTENSIONS)
        )
        if any(p.lower().endswith(".png") for p in self.paths) and not have_png_support():
            raise ParamInvalidError(f"ImageFolder {directory!r}: PNG files need Pillow (pip install pillow)")

    def __len__(self) -> int:
        return len(self.paths)

    def __iter__(self):
        return iter(self.paths)

    @property
    def height(self) -> int:
        return self._first_shape()[0]

    @property
    def width(self) -> int:
        return self._first_shape()[1]

    def _first_shape(self) -> tuple:
        """The first frame's shape (the folder's frame size; later frames must match it)."""
        if not self.paths:
            raise ParamInvalidError(f"ImageFolder {self.directory!r}: no .png or .npy frames")
        if getattr(self, "_shape", None) is None:
            self._shape = self.decode(self.paths[0]).shape
        return self._shape

    def decode(self, path: str) -> np.ndarray:
        if path.lower().endswith(".npy"):
            arr = np.load(path, allow_pickle=False)
        else:
            from PIL import Image

            try:
                with Image.open(path) as im:
                    arr = np.asarray(im.convert("RGB"))
            except OSError as exc:
                raise ParamInvalidError(f"ImageFolder: cannot read {path!r}: {exc}") from None
        if arr.ndim != 3 or arr.shape[2] != 3 or arr.dtype != np.uint8:
            raise ParamInvalidError(
                f"ImageFolder: {path!r} holds a {arr.shape} {arr.dtype} array, expected (H, W, 3) uint8"
            )
        return arr

    def __repr__(self) -> str:
        return f"ImageFolder({self.directory!r}, {len(self.paths)} frames)"
