"""Runs inside the GPU trainer image for tests/e2e/test_gpu_image.py; prints one JSON object.

The image has no pip and no binutils: distributions come from importlib.metadata, and library
lookup from glibc itself (dlinfo), so the paths are the ones TensorFlow's own dlopen() would take.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.metadata as md
import json
import os
import re
import subprocess
from collections import defaultdict
from pathlib import Path

# What TensorFlow dlopens by soname when a GPU is present (libcuda.so.1, the driver, is the host's).
LIBRARIES = {
    "cuda_runtime": "libcudart.so.12",
    "cublasLt": "libcublasLt.so.12",
    "cublas": "libcublas.so.12",
    "cudnn": "libcudnn.so.9",
    "nccl": "libnccl.so.2",
}
# <dlfcn.h>: the search path dlopen() uses for calls made from a given object (its RUNPATH first).
RTLD_DI_SERINFO, RTLD_DI_SERINFOSIZE = 4, 5
SHARED_OBJECT = re.compile(r"\.so(\.\d+)*$")


class SerPath(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("flags", ctypes.c_uint)]


class SerInfo(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("count", ctypes.c_uint)]


def search_path(library: str) -> list[str]:
    """Directories, in order, that dlopen() called from `library` searches ($ORIGIN expanded)."""
    libc = ctypes.CDLL(None)
    handle = ctypes.c_void_p(ctypes.CDLL(library)._handle)
    sizes = SerInfo()
    if libc.dlinfo(handle, RTLD_DI_SERINFOSIZE, ctypes.byref(sizes)) != 0:
        raise OSError(f"dlinfo failed for {library}")
    buf = ctypes.create_string_buffer(sizes.size)
    header = SerInfo.from_buffer(buf)
    header.size, header.count = sizes.size, sizes.count
    libc.dlinfo(handle, RTLD_DI_SERINFO, buf)
    entries = (SerPath * sizes.count).from_buffer(buf, ctypes.sizeof(SerInfo))
    return [os.path.normpath(e.name.decode()) for e in entries]


def load(soname: str, dirs: list[str]) -> dict:
    path = next((os.path.join(d, soname) for d in dirs if os.path.exists(os.path.join(d, soname))), None)
    if path is None:
        return {"path": None, "error": "not on the search path"}
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as err:
        return {"path": path, "error": str(err)}
    return {"path": path, "error": None}


def duplicate_libraries(dists: list[md.Distribution]) -> list[list[str]]:
    """Shared objects installed twice with identical bytes, as `distribution:path` (wheels hold no
    symlinks, so every copy is real). Copies inside one wheel are its own; across two they are ours."""
    by_size = defaultdict(list)
    for dist in dists:
        for file in dist.files or ():
            path = Path(dist.locate_file(file))
            if SHARED_OBJECT.search(path.name) and path.is_file():
                by_size[path.stat().st_size].append((dist.metadata["Name"], path))
    by_hash = defaultdict(list)
    for entries in (e for e in by_size.values() if len(e) > 1):
        for name, path in entries:
            by_hash[hashlib.sha256(path.read_bytes()).hexdigest()].append(f"{name}:{path}")
    return sorted(p for p in by_hash.values() if len(p) > 1)


def xla_toolkit(tf_dir: Path) -> dict:
    """What XLA finds in the CUDA root it derives from its own library: ../nvidia/cuda_nvcc."""
    root = (tf_dir / ".." / "nvidia" / "cuda_nvcc").resolve()
    ptxas = root / "bin" / "ptxas"
    version = (
        subprocess.run([str(ptxas), "--version"], capture_output=True, text=True).stdout
        if ptxas.exists()
        else ""
    )
    return {
        "root": str(root),
        "libdevice": (root / "nvvm" / "libdevice" / "libdevice.10.bc").is_file(),
        "ptxas": next((line for line in version.splitlines() if "release" in line), None),
    }


def main() -> None:
    import tensorflow as tf

    tf_dir = Path(tf.sysconfig.get_lib())
    dists = list(md.distributions())
    dirs = search_path(str(tf_dir / "libtensorflow_framework.so.2"))
    print(
        json.dumps(
            {
                "installed": {d.metadata["Name"]: d.version for d in dists},
                "tensorflow_providers": sorted(
                    d.metadata["Name"]
                    for d in dists
                    if any(str(f) == "tensorflow/__init__.py" for f in d.files or ())
                ),
                "build_info": {k: str(v) for k, v in tf.sysconfig.get_build_info().items()},
                "gpus": [d.name for d in tf.config.list_physical_devices("GPU")],
                "libraries": {name: load(soname, dirs) for name, soname in LIBRARIES.items()},
                "site_packages": str(tf_dir.parent),
                "duplicates": duplicate_libraries(dists),
                "wheels_left": [
                    str(p) for top in ("/opt", "/root", "/tmp", "/app") for p in Path(top).rglob("*.whl")
                ],
                "pip_cache": [p for p in ("/root/.cache/pip", "/tmp/.cache/pip") if os.path.exists(p)],
                "tf_headers": (tf_dir / "include").is_dir(),
                "xla_toolkit": xla_toolkit(tf_dir),
            }
        )
    )


if __name__ == "__main__":
    main()
