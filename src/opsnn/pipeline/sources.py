"""Frame sources for the video pipeline: synthesized frames, a local video file, an image folder.

A source is an iterable of *packets* (cheap to produce: a frame index, an encoded chunk, a
file path) plus ``decode(packet) -> (H, W, 3) uint8 array``: the pipeline's decode stage.
Splitting read from decode keeps the decoding work on the decode stage's thread::

    >>> from opsnn.pipeline.sources import SyntheticVideo
    >>> src = SyntheticVideo(num_frames=3, height=48, width=64)
    >>> [src.decode(p).shape for p in src]
    [(48, 64, 3), (48, 64, 3), (48, 64, 3)]

Video files use ``imageio-ffmpeg`` (a wheel that ships its own ffmpeg binary) and PNG folders
use Pillow; both are optional (``pip install opsnn[video]``): without them use
:class:`SyntheticVideo` or a folder of ``.npy`` frames.
"""
from __future__ import annotations

import os

import numpy as np

from ..errors import ParamInvalidError


def _check_dims(who: str, height, width) -> tuple[int, int]:
    for n, v in (("height", height), ("width", width)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ParamInvalidError(f"{who}: {n} must be a positive int, got {v!r}")
    return int(height), int(width)


def synth_frame(index: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    """Frame ``index`` of a deterministic moving test pattern (gradients, a moving disc,
    seeded sensor-like noise of 0-3 levels), ``(height, width, 3)`` uint8. The noise was 0-15
    levels, fresh in every pixel of every frame: H.264 then needs ~70 Mbit/s at 720p30 (real
    720p video: a few Mbit/s) and ffmpeg spent 43 ms of CPU decoding each frame; with 0-3 levels
    25 Mbit/s and 20 ms (2-core dev VM)."""
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


def _ffmpeg():
    try:
        import imageio_ffmpeg
    except ImportError:
        raise ParamInvalidError("video files need the 'imageio-ffmpeg' package (pip install imageio-ffmpeg, "
                                "or opsnn[video]); use SyntheticVideo or an image folder instead") from None
    return imageio_ffmpeg


def have_video_support() -> bool:
    """True when ``imageio-ffmpeg`` is importable (video files can be written and read)."""
    try:
        import imageio_ffmpeg  # noqa: F401
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
    """Encode ``(H, W, 3)`` uint8 frames into an H.264 video at ``path`` (ffmpeg from imageio-ffmpeg)."""
    ff = _ffmpeg()
    writer = None
    n = 0
    try:
        for f in frames:
            f = np.ascontiguousarray(f)
            if f.ndim != 3 or f.shape[2] != 3 or f.dtype != np.uint8:
                raise ParamInvalidError(f"write_video: frames must be (H, W, 3) uint8, got {f.shape} {f.dtype}")
            if writer is None:
                writer = ff.write_frames(path, (f.shape[1], f.shape[0]), fps=fps, quality=quality,
                                         macro_block_size=1, ffmpeg_log_level="error")
                writer.send(None)
                shape = f.shape
            elif f.shape != shape:
                raise ParamInvalidError(f"write_video: frame {n} has shape {f.shape}, frame 0 had {shape}")
            writer.send(f)
            n += 1
    finally:
        if writer is not None:
            writer.close()
    if n == 0:
        raise ParamInvalidError("write_video: no frames given")
    return path


class VideoFile:
    """Frames of a local video file, decoded by ffmpeg (from imageio-ffmpeg) to RGB24.

    Packets are the raw frame bytes read from ffmpeg's pipe; ``decode`` turns one into an
    ``(H, W, 3)`` array. ``len()`` is ffmpeg's frame count estimate (exact for files written
    by :func:`write_video`). A file that is missing or not a video raises ``ParamInvalidError``
    here; a file truncated mid-stream ends early (ffmpeg stops at the damage). The decoding itself
    runs in ffmpeg's process as frames are read, in sequence: one decode worker."""

    independent_frames = False

    def __init__(self, path: str):
        ff = _ffmpeg()
        if not os.path.isfile(path):
            raise ParamInvalidError(f"VideoFile: no such file {path!r}")
        self.path = path
        try:
            gen = ff.read_frames(path)
            meta = next(gen)
            gen.close()
        except (RuntimeError, OSError, StopIteration) as exc:
            raise ParamInvalidError(f"VideoFile: {path!r} is not a readable video: {exc}") from None
        self.width, self.height = meta["size"]
        self.fps = meta.get("fps") or 0.0
        try:
            self.num_frames = int(ff.count_frames_and_secs(path)[0])
        except (RuntimeError, OSError):
            self.num_frames = None

    def __len__(self) -> int:
        if self.num_frames is None:
            raise TypeError("VideoFile: frame count unknown")
        return self.num_frames

    def __iter__(self):
        gen = _ffmpeg().read_frames(self.path, pix_fmt="rgb24")
        try:
            next(gen)  # metadata
            yield from gen
        finally:
            gen.close()

    def decode(self, packet) -> np.ndarray:
        frame = np.frombuffer(packet, np.uint8)
        if frame.size != self.height * self.width * 3:
            raise ParamInvalidError(f"VideoFile {self.path!r}: a frame has {frame.size} bytes, expected "
                                    f"{self.height}x{self.width}x3")
        return frame.reshape(self.height, self.width, 3)

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
        self.paths = sorted(os.path.join(directory, f) for f in os.listdir(directory)
                            if f.lower().endswith(self.EXTENSIONS))
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
            raise ParamInvalidError(f"ImageFolder: {path!r} holds a {arr.shape} {arr.dtype} array, expected "
                                    "(H, W, 3) uint8")
        return arr

    def __repr__(self) -> str:
        return f"ImageFolder({self.directory!r}, {len(self.paths)} frames)"
