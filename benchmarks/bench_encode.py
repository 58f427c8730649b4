#!/usr/bin/env python
"""Encode throughput of the ``timm`` kind against the same model's bare forward pass.

    python benchmarks/bench_encode.py                       # resnet10t, 512 images, 256 x 128
    python benchmarks/bench_encode.py --images 2048 --device cuda --batch-size 128

Both measurements run in this one process, interleaved ``--repeat`` times, with the same
torch threads and device:

- ``bare``: the model's forward pass over tensors decoded and preprocessed beforehand
  (host tensors, batch by batch, copied to the device inside the timed loop);
- ``rankwise``: :func:`rankwise.encoders.encode_manifest` with kind ``timm`` end to end:
  model build, strict checkpoint load, JPEG decoding and resizing on the thread pool
  (between forward passes on a CPU, overlapping them on a GPU), the Zarr store written
  atomically.

Images are synthetic person-crop JPEGs in a folder under ``benchmarks/results/encode-data``
(git-ignored), made once per image set and count: ``--images-set small`` (height 96-192,
width 48-96: Market-1501's 128 x 64 crops) or ``large`` (height 192-384, width 96-192:
MSMT17-like crops, four times the pixels to decode and downscale per image). The
checkpoint is the model's random initialisation (nothing is downloaded). The script
prints images/s for each, their ratio (target >= 0.9), the CPU seconds of each (a
steadier measure of the overhead on a shared machine), and checks that both give the
same embeddings (max abs difference).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "workflow"))  # run from a checkout without installing

from rankwise.encoders import default_workers, encode_manifest  # noqa: E402

IMAGE_SETS = {"small": (96, 48), "large": (192, 96)}  # smallest (height, width); largest 2x


def make_images(folder: Path, n: int, image_set: str = "small", seed: int = 0) -> Path:
    """``n`` JPEG crops of ``image_set``'s sizes and their manifest; made once."""
    from PIL import Image

    manifest = folder / "manifest.csv"
    if manifest.is_file():
        return manifest
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    lines = ["id,label,path"]
    for i in range(n):
        low_h, low_w = IMAGE_SETS[image_set]
        h, w = int(rng.integers(low_h, 2 * low_h + 1)), int(rng.integers(low_w, 2 * low_w + 1))
        gradient = np.linspace(0, 1, h)[:, None, None] * rng.uniform(0, 255, size=(1, 1, 3))
        image = np.clip(gradient + rng.normal(0, 30, size=(h, w, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(image).save(folder / f"{i:05d}.jpg", quality=90)
        lines.append(f"{i},{i % 100},{i:05d}.jpg")
    manifest.write_text("\n".join(lines) + "\n")
    return manifest


def predecode(manifest: Path, size: tuple[int, int], mean, std):
    """Every image preprocessed as the ``timm`` kind does, as one (N, 3, H, W) tensor."""
    import torch
    from PIL import Image

    rows = manifest.read_text().splitlines()[1:]
    mean, std = np.float32(mean), np.float32(std)
    batch = []
    for row in rows:
        path = manifest.parent / row.split(",")[2]
        image = (
            Image.open(path).convert("RGB").resize((size[1], size[0]), Image.Resampling.BILINEAR)
        )
        x = (np.asarray(image, np.float32) / 255 - mean) / std
        batch.append(x.transpose(2, 0, 1))
    return torch.from_numpy(np.ascontiguousarray(np.stack(batch)))


def bare_forward(model, x, batch_size: int, device: str) -> tuple[float, float, np.ndarray]:
    """Wall and CPU seconds of the forward pass over ``x`` in batches, and the embeddings."""
    import torch

    outputs = []
    cpu, start = time.process_time(), time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(x), batch_size):
            outputs.append(model(x[i : i + batch_size].to(device)).float().cpu())
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, time.process_time() - cpu, torch.cat(outputs).numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet10t", help="timm model name")
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument(
        "--images-set", choices=sorted(IMAGE_SETS), default="small", help="source image sizes"
    )
    parser.add_argument("--size", type=int, nargs=2, default=[256, 128], metavar=("H", "W"))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--workers",
        type=int,
        default=default_workers(),
        help="decoding threads and CPU torch threads",
    )
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = parser.parse_args()

    import timm
    import torch

    from rankwise.torch_encoders import resolve_device

    device = resolve_device("timm", args.device, False)
    if device == "cpu":
        torch.set_num_threads(args.workers)
    folder = f"n{args.images}" if args.images_set == "small" else f"large-n{args.images}"
    manifest = make_images(HERE / "results" / "encode-data" / folder, args.images, args.images_set)
    torch.manual_seed(0)
    model = timm.create_model(args.model, pretrained=False, num_classes=0).eval().to(device)
    config = timm.data.resolve_model_data_config(model)
    x = predecode(manifest, tuple(args.size), config["mean"], config["std"])
    bare_forward(model, x[: args.batch_size], args.batch_size, device)  # warm-up

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp) / "epoch_001.pth"
        torch.save({"epoch": 1, "state_dict": model.state_dict()}, checkpoint)
        options = {
            "model": args.model,
            "checkpoint": str(checkpoint),
            "input_size": list(args.size),
            "device": device,
        }
        bare, ours, bare_cpu, ours_cpu, diff = [], [], [], [], 0.0
        for r in range(args.repeat):
            seconds, cpu_seconds, expected = bare_forward(model, x, args.batch_size, device)
            bare.append(seconds)
            bare_cpu.append(cpu_seconds)
            out = Path(tmp) / f"run{r}.zarr"
            cpu, start = time.process_time(), time.perf_counter()
            encode_manifest(
                manifest,
                "timm",
                options,
                out,
                batch_size=args.batch_size,
                workers=args.workers,
                progress=False,
            )
            ours.append(time.perf_counter() - start)
            ours_cpu.append(time.process_time() - cpu)
            import zarr

            got = np.asarray(zarr.open_group(str(out), mode="r")["embeddings"][...])
            diff = max(diff, float(np.abs(got - expected).max()))

    bare_ips, ours_ips = args.images / min(bare), args.images / min(ours)
    result = {
        "model": args.model,
        "images": args.images,
        "images_set": args.images_set,
        "input_size": args.size,
        "batch_size": args.batch_size,
        "workers": args.workers,
        "device": device,
        "torch_threads": torch.get_num_threads(),
        "repeat": args.repeat,
        "bare_seconds": bare,
        "rankwise_seconds": ours,
        "bare_cpu_seconds": bare_cpu,
        "rankwise_cpu_seconds": ours_cpu,
        "cpu_ratio": round(min(bare_cpu) / min(ours_cpu), 3),
        "bare_images_per_s": round(bare_ips, 1),
        "rankwise_images_per_s": round(ours_ips, 1),
        "ratio": round(ours_ips / bare_ips, 3),
        "max_abs_diff": diff,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "timm": timm.__version__,
            "cuda": torch.cuda.get_device_name() if device == "cuda" else None,
        },
    }
    print(
        f"{args.model} at {args.size[0]} x {args.size[1]}, {args.images} {args.images_set} "
        f"images, batch "
        f"{args.batch_size}, {args.workers} workers, {device}; best of {args.repeat}"
    )
    print(f"  bare forward on pre-decoded tensors  {bare_ips:8.1f} images/s")
    print(f"  rankwise encode (timm kind)          {ours_ips:8.1f} images/s")
    print(f"  ratio {ours_ips / bare_ips:.3f} (target >= 0.9); max abs difference {diff:.2e}")
    print(
        f"  CPU seconds, best run: bare {min(bare_cpu):.2f}, rankwise {min(ours_cpu):.2f} "
        f"(ratio {min(bare_cpu) / min(ours_cpu):.3f}; the wall-clock ratio is only "
        "meaningful on an otherwise idle machine)"
    )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
