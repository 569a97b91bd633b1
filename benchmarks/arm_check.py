#!/usr/bin/env python
"""ARM under user-mode emulation, bit for bit against x86: the generated C and micro itself.

    python benchmarks/arm_check.py                      # arm64 and armhf; the Debian roots are cached
    python benchmarks/arm_check.py --arch arm64 --no-micro

Tools (Debian/Ubuntu): ``apt-get install qemu-user gcc-aarch64-linux-gnu gcc-arm-linux-gnueabihf debootstrap``
(the cross compilers bring their C libraries; ``debootstrap`` only for the micro part).

1. **Generated C**: for an MLP, a CNN with max and average pooling, and a network with integer batch norm and a
   residual block, ``codegen-check`` compiles the C with the cross compiler (``-static``), runs it under
   ``qemu-aarch64`` / ``qemu-arm`` and compares every logit and master code after every step, and the
   predictions, with micro on x86.
2. **micro on ARM**: a Debian bookworm root of the architecture with the distribution's ``python3-numpy``
   (``debootstrap --foreign`` downloads it; the packages are unpacked with ``dpkg-deb -x``, nothing runs as
   root inside), then micro trains the same models on the same data under ``qemu-<arch> -L ROOT`` with that
   Python and NumPy, and every logit and master code after every step is compared with micro on x86.

Exit status 0 iff everything that ran was bit-exact; 3 when a needed tool is missing (nothing ran).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

ROOT_DIR = Path(__file__).resolve().parents[1]
SRC = ROOT_DIR / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

import numpy as np  # noqa: E402

from inttrain.micro import SGD, IntTensor, Sequential, load_model, save_model, softmax_cross_entropy_grad  # noqa: E402

ARCHES = {"arm64": ("aarch64-linux-gnu-gcc", "qemu-aarch64"), "armhf": ("arm-linux-gnueabihf-gcc", "qemu-arm")}
C = lambda i, o, k=3, s=1, p=1: {"type": "conv2d", "in_channels": i, "out_channels": o, "kernel_size": k,  # noqa: E731
                                 "stride": s, "padding": p}
R = {"type": "relu"}
MODELS = {
    "mlp": {"input_shape": [16], "layers": [{"type": "linear", "in_features": 16, "out_features": 12}, R,
                                            {"type": "linear", "in_features": 12, "out_features": 5}]},
    "cnn": {"input_shape": [1, 12, 12], "layers": [
        C(1, 4), R, {"type": "maxpool2d", "kernel_size": 2}, {"type": "avgpool2d", "kernel_size": 3},
        C(4, 6, s=2), R, {"type": "flatten"}, {"type": "linear", "in_features": 6, "out_features": 5}]},
    "bn_residual": {"input_shape": [1, 8, 8], "layers": [
        C(1, 8), {"type": "batchnorm", "num_features": 8}, R,
        {"type": "residual", "layers": [C(8, 8), {"type": "batchnorm", "num_features": 8}, R, C(8, 8)]}, R,
        {"type": "maxpool2d", "kernel_size": 2}, {"type": "flatten"}, {"type": "linear", "in_features": 128, "out_features": 5}]},
}
BATCH, LR_SHIFT = 8, 3


def make_inputs(d: Path) -> None:
    """Models (saved: their initial codes travel as files, no RNG or float on the other side) and data."""
    for i, (name, desc) in enumerate(MODELS.items()):
        save_model(Sequential.from_description(desc), d / name)
        rng = np.random.default_rng(i)
        np.savez(d / f"{name}.npz", x=rng.integers(-127, 128, size=(40, *desc["input_shape"])).astype(np.int8),
                 y=rng.integers(0, 5, 40))


def trace(d: Path, steps: int) -> dict[str, np.ndarray]:
    """micro training of every model on its data in fixed batches: logits and master codes after each step."""
    out = {}
    for name in MODELS:
        model = load_model(d / name)
        data = np.load(d / f"{name}.npz", allow_pickle=False)
        opt = SGD(model.params(), LR_SHIFT)
        for s in range(steps):
            b = np.arange(s * BATCH, (s + 1) * BATCH) % len(data["x"])
            logits = model.forward(IntTensor(data["x"][b], -7))
            model.backward(softmax_cross_entropy_grad(logits, data["y"][b])[0])
            opt.step()
            out[f"{name}/{s}/logits"] = logits.q.astype(np.int8)
            out[f"{name}/{s}/logits_exp"] = np.array(logits.exp)
            for pname, p in model.named_params():
                out[f"{name}/{s}/{pname}"] = p.acc
    return out


def c_checks(arch: str, d: Path, steps: int) -> list[str]:
    from inttrain.micro.codegen import run_check

    cc, qemu = ARCHES[arch]
    lines = []
    for name in MODELS:
        data = np.load(d / f"{name}.npz", allow_pickle=False)
        r = run_check(lambda: load_model(d / name), data["x"], -7, data["y"], steps, BATCH, LR_SHIFT, cc=shutil.which(cc),
                      cflags=["-static"], runner=[qemu])
        lines.append(f"{arch} C {name}: {'bit-exact' if r.ok else 'DIFFERS'}: {r.message}")
        print(lines[-1], flush=True)
    return lines


def debian_root(arch: str, cache: Path) -> Path:
    """An unpacked bookworm root with python3-numpy (first stage of debootstrap + dpkg-deb -x of every package)."""
    root = cache / f"bookworm-{arch}"
    ready = root / ".inttrain-ready"
    if ready.exists():
        return root
    if root.exists():                                    # an interrupted earlier build of ours: start over
        shutil.rmtree(root)
    root.mkdir(parents=True)
    subprocess.run(["debootstrap", "--foreign", "--variant=minbase", f"--arch={arch}", "--include=python3-numpy",
                    "bookworm", str(root), "http://deb.debian.org/debian"], check=True, stdout=subprocess.DEVNULL)
    for deb in sorted((root / "var/cache/apt/archives").glob("*.deb")):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    # what dpkg's configure step (update-alternatives) would link: libblas.so.3 / liblapack.so.3 from their dirs
    for lib, sub in (("libblas.so.3", "blas"), ("liblapack.so.3", "lapack")):
        for found in root.glob(f"usr/lib/*/{sub}/{lib}"):
            link = found.parent.parent / lib
            if not link.exists():
                link.symlink_to(Path(sub) / lib)
    ready.write_text("debootstrap --foreign + dpkg-deb -x\n")
    return root


def micro_check(arch: str, d: Path, steps: int, cache: Path) -> list[str]:
    root = debian_root(arch, cache)
    qemu = ARCHES[arch][1]
    out = d / f"trace-{arch}.npz"
    env = {**os.environ, "PYTHONPATH": str(SRC), "QEMU_LD_PREFIX": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    ver = subprocess.run([qemu, str(root / "usr/bin/python3"), "-c", "import numpy, platform; print(platform.machine(), "
                          "platform.python_version(), numpy.__version__)"], env=env, capture_output=True, text=True, check=True)
    subprocess.run([qemu, str(root / "usr/bin/python3"), __file__, "--trace-dir", str(d), "--trace-out", str(out),
                    "--steps", str(steps)], env=env, check=True)
    mine = trace(d, steps)
    theirs = np.load(out, allow_pickle=False)
    diff = next((k for k in mine if not np.array_equal(mine[k], theirs[k])), None)
    line = (f"{arch} micro ({ver.stdout.strip()}): "
            + (f"bit-exact with x86: {len(mine)} logits/codes arrays over {steps} steps x {len(MODELS)} models"
               if diff is None and set(theirs.files) == set(mine) else f"DIFFERS first at {diff}"))
    print(line, flush=True)
    return [line]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="arm64,armhf")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "inttrain-arm"), help="Debian roots are kept here")
    ap.add_argument("--no-micro", action="store_true", help="only the generated C (no Debian root)")
    ap.add_argument("--json", default=None, help="write the result lines here")
    ap.add_argument("--trace-dir", help=argparse.SUPPRESS)           # internal: the emulated side
    ap.add_argument("--trace-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.trace_dir:
        np.savez(args.trace_out, **trace(Path(args.trace_dir), args.steps))
        return 0
    arches = args.arch.split(",")
    need = [t for a in arches for t in ARCHES[a]] + ([] if args.no_micro else ["debootstrap", "dpkg-deb"])
    missing = [t for t in need if shutil.which(t) is None]
    if missing:
        print(f"arm_check: missing tools: {', '.join(missing)} (see the docstring for the packages)", file=sys.stderr)
        return 3
    lines = []
    with tempfile.TemporaryDirectory(prefix="inttrain-arm-") as tmp:
        d = Path(tmp)
        make_inputs(d)
        for arch in arches:
            lines += c_checks(arch, d, args.steps)
            if not args.no_micro:
                lines += micro_check(arch, d, args.steps, Path(args.cache))
    if args.json:
        Path(args.json).write_text(json.dumps(lines, indent=1))
    return 0 if all("DIFFERS" not in ln for ln in lines) else 1


if __name__ == "__main__":
    raise SystemExit(main())
