"""Recompress the GPU bundle's slimmed Ray (``.gpubundle/ray_slim.zip``, written by
``../shared/gpu-host/bundle.sh``) with LZMA: 41 MB of deflate become 30 MB, so that the tracked tree
and the bundle stay under the 64 MiB a device call carries. ``install.sh`` extracts it unchanged
(Python's zipfile reads LZMA members). Takes about 80 s on two cores.

Usage: python bench/lzma_gpubundle.py [BUNDLE_DIR]   (default .gpubundle)
"""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path


def main() -> None:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else ".gpubundle") / "ray_slim.zip"
    with zipfile.ZipFile(path) as zin:
        if all(info.compress_type == zipfile.ZIP_LZMA for info in zin.infolist()):
            print(f"{path}: already LZMA")
            return
        tmp = path.with_suffix(".lzma.tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_LZMA) as zout:
            for info in zin.infolist():
                zout.writestr(info, zin.read(info.filename), compress_type=zipfile.ZIP_LZMA)
    before = path.stat().st_size
    os.replace(tmp, path)
    print(f"{path}: {before / 2**20:.1f} -> {path.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
