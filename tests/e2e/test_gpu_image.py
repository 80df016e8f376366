"""The GPU trainer image, built and exercised on a host without GPUs.

`make images VARIANT=gpu` takes the path `make up GPUS=N` takes on a GPU host: the CUDA wheelhouse
downloaded on the host, the image built offline from the generated GPU overlay. Then, in the image:
the hash lock is exactly what is installed and there is one TensorFlow; it is a CUDA build whose CUDA
runtime, cuBLAS, cuDNN and NCCL load from the nvidia-* wheels on TensorFlow's own search path, and XLA
finds ptxas and libdevice; the GPU overlay names this image; a chief + 1 worker from that overlay train
on the CPU and each says why, once. What needs a real GPU is listed in the docs/gpus.md.
With CI=true a missing engine fails (conftest.engine_ready).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from compose import emit
from compose.deployment import Deployment
from tests.e2e.conftest import ROOT, engine_ready

pytestmark = [pytest.mark.docker, pytest.mark.gpu_image]

PROJECT = "mwms-gpuimage"
BUILD_TIMEOUT_S = 3600  # a clean machine downloads ~3.3 GB of wheels and writes a ~9 GB image
TRAIN_TIMEOUT_S = 600
STEPS = 20
CPU_LINE = re.compile(r"(chief|worker-\d+): running on CPU: (.*)")


def lock_pins(lock: Path) -> dict[str, str]:
    pins = re.findall(r"^([A-Za-z0-9._-]+)==([^ \\\n]+)", lock.read_text(), re.MULTILINE)
    return {normalize(name): version for name, version in pins}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.fixture(scope="module")
def image() -> str:
    engine_ready()
    start = time.monotonic()
    # make test's make test-images ran this same command before the unit tests ended (its stamp says it
    # succeeded in this make test): built again here, it only resent its 3.5 GB context.
    stamp = os.environ.get("TEST_IMAGES_GPU_BUILT")
    if stamp and (ROOT / stamp).exists():
        print(
            f"make images VARIANT=gpu: built by this make test's make test-images at {(ROOT / stamp).read_text().strip()}"
        )
    else:
        built = subprocess.run(
            ["make", "--no-print-directory", "images", "VARIANT=gpu", "OFFLINE=1"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
        assert built.returncode == 0, (
            f"make images VARIANT=gpu failed:\n{built.stdout[-3000:]}\n{built.stderr[-3000:]}"
        )
    tag = Deployment(workers=1, image_repo=os.environ.get("IMAGE_REPO", "mwms/trainer")).image("gpu")
    size = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Size}}", tag], capture_output=True, text=True
    )
    assert size.returncode == 0, f"make images VARIANT=gpu did not tag {tag}"
    print(f"GPU image {tag}: {int(size.stdout) / 1e9:.2f} GB, make images {time.monotonic() - start:.0f}s")
    return tag


@pytest.fixture(scope="module")
def probe(image: str) -> dict:
    probe_py = ROOT / "tests" / "e2e" / "gpu_image_probe.py"
    # root inside: the probe also looks for pip caches in /root; --network none: it needs nothing outside.
    out = subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "--network",
            "none",
            "--user",
            "0",
            "-v",
            f"{probe_py}:/probe.py:ro",
            image,
            "python",
            "/probe.py",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def rendered(image: str, tmp_path_factory) -> dict:
    """`docker compose config` of a chief + 1 worker on GPUs 0 and 1, as `make up GPUS=0,1 WORKERS=1` renders it."""
    out = tmp_path_factory.mktemp("gpu-run")
    cfg = Deployment(
        workers=1,
        image_repo=image.rsplit(":", 1)[0],
        knobs=(("steps", str(STEPS)),),
        gpu_ids={"chief": ("0",), "worker-0": ("1",)},
    )
    files = emit.emit_deployment("compose", cfg, out).emitted.extra["compose_files"]
    assert files[-1].name == "compose.gpu.yaml"
    args = [a for f in files for a in ("-f", str(f))]
    config = subprocess.run(
        [
            "docker",
            "compose",
            "--project-directory",
            str(ROOT),
            "-p",
            PROJECT,
            *args,
            "config",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert config.returncode == 0, config.stderr
    return json.loads(config.stdout)


def test_the_lock_is_exactly_what_is_installed(probe):
    installed = {normalize(name): version for name, version in probe["installed"].items()}
    assert installed == lock_pins(ROOT / "images" / "requirements-gpu.lock")  # and so no pip either


def test_one_tensorflow_and_it_is_the_cuda_build(probe):
    assert probe["tensorflow_providers"] == ["tensorflow"], (
        "a second TensorFlow (tensorflow-cpu?) is installed"
    )
    info = probe["build_info"]
    assert info["is_cuda_build"] == "True", info
    assert info["cuda_version"].startswith("12") and info["cudnn_version"].startswith("9"), info
    assert probe["gpus"] == []


def test_cuda_libraries_load_from_the_wheels_on_tensorflows_search_path(probe):
    wheels = probe["site_packages"] + "/nvidia/"
    for name, lib in probe["libraries"].items():
        assert lib["error"] is None, f"{name}: {lib}"
        assert lib["path"].startswith(wheels), f"{name} came from {lib['path']}, not from an nvidia-* wheel"


def test_xla_finds_ptxas_and_libdevice_from_the_nvcc_wheel(probe):
    # XLA compiles tf-keras' optimizer step on GPU (jit_compile): it needs libdevice and ptxas, which
    # only nvidia-cuda-nvcc-cu12 ships (docs/gpus.md: why that wheel stays).
    toolkit = probe["xla_toolkit"]
    assert toolkit["libdevice"], toolkit
    assert toolkit["ptxas"] and "release 12." in toolkit["ptxas"], toolkit


def test_no_library_twice_no_wheels_no_pip_cache(probe):
    # The tensorflow wheel itself holds two identical 4 KB tflite stubs; only copies across wheels
    # (a second TensorFlow, a CUDA library shipped by two packages) are ours to avoid.
    across = [group for group in probe["duplicates"] if len({entry.split(":")[0] for entry in group}) > 1]
    assert across == []
    assert probe["wheels_left"] == [] and probe["pip_cache"] == []


def test_no_custom_op_headers(probe):
    """TensorFlow's C++ headers build custom ops only: every push, pull and load of the image moved them."""
    assert probe["tf_headers"] is False


def test_the_gpu_overlay_names_this_image(image, rendered):
    for task, gpu in (("chief", "0"), ("worker-0", "1")):
        service = rendered["services"][task]
        assert service["image"] == image
        assert int(service["shm_size"]) == 2 * 1024**3  # compose renders "2gb" in bytes
        assert service["deploy"]["resources"]["reservations"]["devices"] == [
            {"driver": "nvidia", "device_ids": [gpu], "capabilities": ["gpu"]}
        ]
    build = rendered["services"]["chief"]["build"]
    assert build["dockerfile"] == "images/trainer.Dockerfile" and build["args"]["VARIANT"] == "gpu"


def test_chief_and_worker_train_on_cpu_and_say_why_once(rendered, tmp_path):
    stack = runnable_without_gpus(rendered)
    compose_file = tmp_path / "compose.json"
    compose_file.write_text(json.dumps(stack))
    dc = ["docker", "compose", "-p", PROJECT, "-f", str(compose_file)]
    subprocess.run([*dc, "down", "--volumes", "--remove-orphans"], capture_output=True, timeout=120)
    try:
        up = subprocess.run([*dc, "up", "-d", "--no-build"], capture_output=True, text=True, timeout=120)
        assert up.returncode == 0, up.stderr
        ids = subprocess.run([*dc, "ps", "-aq"], capture_output=True, text=True).stdout.split()
        codes = subprocess.run(
            ["docker", "wait", *ids], capture_output=True, text=True, timeout=TRAIN_TIMEOUT_S
        )
        logs = {i: subprocess.run(["docker", "logs", i], capture_output=True, text=True).stderr for i in ids}
        assert codes.stdout.split() == ["0"] * len(ids), "\n".join(v[-2000:] for v in logs.values())
        for log in logs.values():
            reasons = CPU_LINE.findall(log)
            assert len(reasons) == 1, f"expected one 'running on CPU' line:\n{log[-3000:]}"
            assert "CUDA build" in reasons[0][1] and "libcuda.so.1" in reasons[0][1]
            assert f"step {STEPS}/{STEPS}" in log and "2 replicas in sync" in log
    finally:
        subprocess.run([*dc, "down", "--volumes", "--remove-orphans"], capture_output=True, timeout=120)


def runnable_without_gpus(rendered: dict) -> dict:
    """The rendered trainer services minus what a host without the NVIDIA runtime refuses (the device
    reservation), without monitoring, and run once: no restarts, no metrics linger, no build."""
    services = {}
    for name in ("chief", "worker-0"):
        service = {k: v for k, v in rendered["services"][name].items() if k not in ("deploy", "build")}
        service.update(
            restart="no",
            pull_policy="never",
            environment={**service["environment"], "TRAINER_METRICS_LINGER": "0"},
        )
        services[name] = service
    return {
        "services": services,
        "networks": {"cluster": rendered["networks"]["cluster"]},
        "volumes": {k: v for k, v in rendered["volumes"].items() if k != "prometheus-data"},
    }
