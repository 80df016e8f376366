"""The start-up device line: one line, and on the CPU the cause a user can act on."""

from trainer.cluster import device

CUDA_BUILD = {"is_cuda_build": True, "cuda_version": "12.5.1", "cudnn_version": "9"}


def missing(name: str) -> object:
    raise OSError(f"{name}: cannot open shared object file: No such file or directory")


def test_gpus_are_named():
    line = device.describe(["NVIDIA A100-SXM4-40GB"], CUDA_BUILD, {}, load=missing)
    assert line == "running on 1 GPU(s): NVIDIA A100-SXM4-40GB"


def test_cpu_build_says_it_is_the_cpu_image():
    line = device.describe([], {"is_cuda_build": False}, {}, load=missing)
    assert line.startswith("running on CPU: this TensorFlow is a CPU-only build")


def test_cuda_build_without_driver_names_the_driver_and_the_fix():
    line = device.describe([], CUDA_BUILD, {}, load=missing)
    assert "CUDA 12.5.1, cuDNN 9" in line
    assert "libcuda.so.1" in line and "GPUS=N" in line and "NVIDIA Container Toolkit" in line


def test_cuda_build_with_driver_but_hidden_gpus_names_the_variable():
    line = device.describe([], CUDA_BUILD, {"CUDA_VISIBLE_DEVICES": ""}, load=lambda name: object())
    assert "the NVIDIA driver loads" in line and "CUDA_VISIBLE_DEVICES=''" in line
    assert "\n" not in line


def test_the_host_tensorflow_is_described_as_what_it_is():
    import tensorflow as tf

    info = tf.sysconfig.get_build_info()
    line = device.describe([], info, {})
    assert line.startswith("running on CPU")
    assert ("CUDA build" in line) == bool(info.get("is_cuda_build"))
