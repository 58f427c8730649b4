"""Helpers shared by the test modules: the console script, Snakemake runs in a temp folder,
dry-run parsing and the C kernels."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SNAKEFILE = ROOT / "Snakefile"


def _exe() -> str:
    for exe in (Path(sys.executable).parent / "rankwise", ROOT / ".venv" / "bin" / "rankwise"):
        if exe.exists():
            return str(exe)
    found = shutil.which("rankwise")
    if found is None:
        pytest.fail("console script `rankwise` not found next to the Python executable")
    return found


#: The `rankwise` console script of the environment running the tests.
RANKWISE = _exe()


def run_rankwise(*args, cwd=None, timeout=120) -> subprocess.CompletedProcess:
    """The ``rankwise`` console script in a fresh process (never raises on failure)."""
    return subprocess.run(
        [RANKWISE, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )


def planned_jobs(text: str) -> dict[str, int]:
    """rule -> number of jobs in a Snakemake dry run's "Job stats" ({} if nothing to do)."""
    if "Nothing to be done" in text:
        return {}
    table = text[text.index("Job stats:") :]
    jobs = {}
    for line in table.splitlines()[3:]:
        match = re.fullmatch(r"(\S+)\s+(\d+)", line.strip())
        if match is None:
            break
        jobs[match[1]] = int(match[2])
    jobs.pop("total", None)
    return jobs


def snakemake(
    workdir: Path,
    config: dict | None,
    *args: str,
    profile: bool = False,
    replace: bool = False,
    configfile: str = "my.yaml",
    snakefile: Path = SNAKEFILE,
) -> subprocess.CompletedProcess:
    """Snakemake on the repository's Snakefile in ``workdir`` (never raises on failure).

    ``config``: written to ``workdir / configfile`` and passed last with ``--configfile``
    (it takes every argument after it); ``None``: the workdir's config/config.yaml.
    ``profile``: keep the workflow's default profile (else ``--workflow-profile none``);
    ``replace``: ``--replace-workflow-config`` (only ``config``, not merged into the default).
    """
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(snakefile),
        "--directory",
        str(workdir),
        "--cores",
        "2",
        *args,
    ]
    if not profile:
        cmd += ["--workflow-profile", "none"]
    if config is not None:
        path = workdir / configfile
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        cmd += ["--configfile", str(path)]
        if replace:
            cmd.append("--replace-workflow-config")
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600)


def write_inputs(folder: Path, query, gallery, qe, ge, *, camera: bool = True) -> list[str]:
    """Manifests (CSV) and embeddings (.npy) of a case in ``folder``; returns the
    ``--query ... --gallery-embeddings ...`` arguments of ``rankwise evaluate``/``rank``
    (``camera=False``: the query manifest without its camera column)."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    (query if camera else query.drop(columns="camera")).to_csv(folder / "q.csv", index=False)
    gallery.to_csv(folder / "g.csv", index=False)
    np.save(folder / "q.npy", qe)
    np.save(folder / "g.npy", ge)
    return input_args(folder)


def input_args(folder: Path) -> list[str]:
    """``--query q.csv ... --gallery-embeddings g.npy`` of the four files in ``folder``."""
    return [
        "--query",
        str(folder / "q.csv"),
        "--gallery",
        str(folder / "g.csv"),
        "--query-embeddings",
        str(folder / "q.npy"),
        "--gallery-embeddings",
        str(folder / "g.npy"),
    ]


def c_kernels(extra_flags: tuple[str, ...] = ()):
    """The C kernels built with rankwise.native's flags plus ``extra_flags``.  Skips only
    where there is no C compiler (numba's kernels run there); where there is one, a
    failed build or self-test fails the test: a broken kernel must not pass as a skip."""
    from rankwise import native

    if native._compiler() is None:
        pytest.skip("no C compiler here: numba's kernels run")
    return native._build(native.FLAGS + tuple(extra_flags))


def float32_settings(torch) -> dict[str, object]:
    """torch's float32 precision settings, read without ever mixing its two APIs: the
    per-backend ``fp32_precision`` strings where torch has them (>= 2.9; its legacy getters
    raise once both APIs were used), else the legacy flags."""
    backends = torch.backends
    if isinstance(getattr(backends.cuda.matmul, "fp32_precision", None), str):
        return {
            "cuda.matmul": backends.cuda.matmul.fp32_precision,
            "cudnn.conv": backends.cudnn.conv.fp32_precision,
            "cudnn.rnn": backends.cudnn.rnn.fp32_precision,
            "mkldnn.matmul": backends.mkldnn.matmul.fp32_precision,
        }
    return {
        "cuda.matmul": backends.cuda.matmul.allow_tf32,
        "cudnn.conv": backends.cudnn.allow_tf32,
        "matmul precision": torch.get_float32_matmul_precision(),
    }


def ieee_float32_settings(torch) -> dict[str, object]:
    """:func:`float32_settings` of a process computing in IEEE float32 throughout."""
    if isinstance(getattr(torch.backends.cuda.matmul, "fp32_precision", None), str):
        return {
            "cuda.matmul": "ieee",
            "cudnn.conv": "ieee",
            "cudnn.rnn": "ieee",
            "mkldnn.matmul": "ieee",
        }
    return {"cuda.matmul": False, "cudnn.conv": False, "matmul precision": "highest"}


def tf32_like_a_training_script(torch) -> None:
    """What training scripts write (the legacy API): TF32 on for matmuls and convolutions."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")


# ---------------------------------------------------------------- PNG files by hand
# Written here byte by byte (PIL writes no interlaced PNG, and no PNG whose image data
# stop early), for rankwise.png_data's tests.

ADAM7 = (
    (0, 0, 8, 8),
    (4, 0, 8, 8),
    (0, 4, 4, 8),
    (2, 0, 4, 4),
    (0, 2, 2, 4),
    (1, 0, 2, 2),
    (0, 1, 1, 2),
)


def png_scanlines(pixels, interlace: bool = False) -> bytes:
    """The unfiltered scanlines (filter byte 0) of an (H, W, 3) uint8 image, in Adam7 pass
    order when ``interlace``: the bytes a PNG's image data inflate to."""
    passes = ADAM7 if interlace else ((0, 0, 1, 1),)
    out = bytearray()
    for x0, y0, dx, dy in passes:
        sub = pixels[y0::dy, x0::dx]
        if sub.shape[0] and sub.shape[1]:  # an empty pass sends nothing, not even filter bytes
            for row in sub:
                out += b"\x00" + row.tobytes()
    return bytes(out)


def png_file(width: int, height: int, scanlines: bytes, interlace: bool = False) -> bytes:
    """An 8-bit RGB PNG whose image data are ``scanlines``, compressed as one zlib stream
    (complete and valid however few rows it holds)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data)
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, int(interlace))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(scanlines))
        + chunk(b"IEND", b"")
    )
