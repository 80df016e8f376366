# The trainer image, CPU or GPU. Built by `make up` on the chief service only; every task runs it.
#   BASE_IMAGE  a Python 3.11 Debian bookworm image: pulled online, built by images/images.sh offline
#   VARIANT     cpu | gpu: images/requirements-<VARIANT>.lock, whose wheels images.sh stages in build/wheelhouse
# No `# syntax=` line: it would pull the Dockerfile frontend from a registry.
ARG BASE_IMAGE=mwms/python:3.11-bookworm
FROM ${BASE_IMAGE}
ARG VARIANT=cpu

# Keras 3 cannot train under MultiWorkerMirroredStrategy (keras-team/keras#20585): use tf-keras.
ENV TF_USE_LEGACY_KERAS=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app \
    PATH=/opt/venv/bin:$PATH

# Wheels come from the host (containers cannot reach PyPI): images.sh stages this variant's wheels in
# build/wheelhouse (this frontend does not expand ${VARIANT} in a mount source, so the check says when
# the staged ones are another variant's). The lock's hashes are checked again here, and --no-deps
# because the lock is the whole closure (tf-keras without GPU tensorflow). TensorFlow's C++ headers
# (287 MB of the CPU image's 1.8 GB venv) only build custom ops, never at run time: every push, pull
# and load of the image (a swarm node's, a Docker-in-Docker node's) moves 16 % less without them.
RUN --mount=type=bind,source=build/wheelhouse,target=/wheels \
    grep -q "requirements-${VARIANT}.lock" /wheels/requirements.lock \
      || { echo "build/wheelhouse holds no ${VARIANT} wheels: build with make images or make up" >&2; exit 1; } \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links=/wheels \
      --no-deps --require-hashes -r /wheels/requirements.lock \
 && /opt/venv/bin/pip uninstall -y -q pip \
 && rm -r /opt/venv/lib/python3.11/site-packages/tensorflow/include

# A non-root user; /checkpoints, /var/lib/supervise (trainer.supervise.supervisor's state) and /logs (TensorBoard's)
# are created owned by it so the named volumes inherit the owner.
# No setuid/setgid binaries (su, mount, passwd, ...): nothing can gain privileges even where
# no-new-privileges is not applied (a Swarm stack drops security_opt).
RUN useradd --uid 1000 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin trainer \
 && install -d -o 1000 -g 1000 /checkpoints /var/lib/supervise /logs \
 && find / -xdev -perm /6000 -type f -exec chmod a-s {} +

# Code last: editing the trainer rebuilds only this layer.
COPY contract /app/contract
COPY trainer /app/trainer
LABEL org.mwms.image=trainer
USER 1000:1000
WORKDIR /tmp
CMD ["python", "-m", "trainer"]
