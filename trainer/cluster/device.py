"""The one start-up line that says which device a task trains on, and why it is the CPU when it is.

The GPU image on a host (or a container) without a GPU trains on the CPU without complaint; TensorFlow's
own hints are C++ log lines a user cannot act on. This names the cause the user can change.
Stdlib only: the caller passes what TensorFlow reports.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping, Sequence

# The driver's user-space library: the NVIDIA Container Toolkit mounts it into a container given GPUs,
# and no wheel ships it. TensorFlow dlopens it first; without it CUDA cannot start.
DRIVER = "libcuda.so.1"


def describe(
    gpus: Sequence[str],
    build: Mapping[str, object],
    env: Mapping[str, str],
    load: Callable[[str], object] = ctypes.CDLL,
) -> str:
    """`gpus`: TensorFlow's GPU device names; `build`: tf.sysconfig.get_build_info()."""
    if gpus:
        return f"running on {len(gpus)} GPU(s): {', '.join(gpus)}"
    if not build.get("is_cuda_build"):
        return (
            "running on CPU: this TensorFlow is a CPU-only build (the cpu image; GPUS=N builds the gpu image)"
        )
    cuda = f"CUDA {build.get('cuda_version', '?')}, cuDNN {build.get('cudnn_version', '?')}"
    try:
        load(DRIVER)
    except OSError:
        return (
            f"running on CPU: TensorFlow is a CUDA build ({cuda}) but the NVIDIA driver ({DRIVER}) is not in "
            "this container, so no GPU was passed in: use GPUS=N on a host with the NVIDIA Container Toolkit"
        )
    visible = env.get("CUDA_VISIBLE_DEVICES")
    hidden = f" with CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
    return (
        f"running on CPU: TensorFlow is a CUDA build ({cuda}) and the NVIDIA driver loads, but no GPU is usable"
        f"{hidden}; check `nvidia-smi` in the container and TensorFlow's error above"
    )
