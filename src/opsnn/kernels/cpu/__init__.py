"""CPU kernels (numba + BLAS), one module per op family.

Importing this package sets one process-wide threading default before numba starts
its first parallel region (``os.environ.setdefault``: a value the user set wins):

``OMP_WAIT_POLICY=PASSIVE`` — numba's OpenMP workers sleep as soon as a parallel loop
ends instead of spinning (libgomp spins ~300,000 iterations by default). Our kernels
alternate numba regions with OpenBLAS GEMMs (im2col -> GEMM, Winograd transform -> GEMMs
-> transform, an elementwise op before a MatMul), and spinning OpenMP workers take the
cores OpenBLAS's threads need. Measured on the 2-core dev machine, shared with other jobs
(``bench/kernels.py --only threads``: a fresh process per setting, 3 interleaved rounds,
median of 40 runs each; per-round medians, the first round was hit by other load):

    workload                         libgomp default    OMP_WAIT_POLICY=PASSIVE   GOMP_SPINCOUNT=0
    im2col conv 64x56x56 3x3         66 / 8.0 / 8.0 ms  49 / 4.1 / 1.4 ms         24 / 24 / 2.9 ms
    10x (relu 256K + sgemm 256^2)    88 / 92 / 80 ms    325 / 3.1 / 2.2 ms        160 / 2.3 / 3.3 ms
    20x relu 256K (numba only)       0.40/0.34/0.36 ms  0.81 / 1.65 / 1.39 ms     0.78/0.78/1.39 ms

(An earlier session, same machine: relu+sgemm 409-582 ms default vs 2.5-12 ms PASSIVE.)
The price is ~25-60 us to wake the workers per parallel region (last row); the gain is
10x-40x wherever numba and BLAS alternate. NUMBA_THREADING_LAYER=workqueue also avoids the
fight (2.8-4.2 ms) but is slower for numba-only chains (1.9-4.1 ms) and not thread-safe.
libgomp reads the variable once, when numba loads it (first parallel kernel), so this runs
before any kernel can; it has no effect if another library (e.g. torch) loaded libgomp first.

``GOMP_SPINCOUNT=10000`` (only when the user set neither variable): a bounded spin before
sleeping. Since MKL's GEMMs run on the same libgomp pool as numba's kernels (see
:mod:`opsnn.kernels.cpu.mkl`), a GEMM -> epilogue -> GEMM chain hands the workers from one
region to the next; with no spin at all each region pays the wake-up. Measured on the 2-core
AVX-512 VM (2026-12-01, ``bench/models.py --models bert,resnet50 --repeat 6``, fresh process
per setting, alternated): BERT-base 88.2 / 92.0 -> 76.4 / 76.6 ms (onnxruntime 76-80 in the
same runs), ResNet-50 51.2 / 48.5 -> 48.6 / 48.4 ms. Longer spins start to fight OpenBLAS'
threads again (GOMP_SPINCOUNT=100000: ResNet-50 62 ms); 1000 is too short to help BERT (84.5).
"""
import os

if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "10000"
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
