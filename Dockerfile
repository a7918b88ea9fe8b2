# dygserve images.
#
#   docker build -t dygserve .                    # default target: slim CPU image
#   docker build --target gpu -t dygserve:gpu .   # CUDA image (onnxruntime-gpu, mamba-ssm best effort)
#
# The install follows the Makefile: torch first, exactly pinned (from the CPU wheel
# index here, so pip never pulls the multi-GB CUDA build), then the package itself.
# The bundled checkpoint is copied to /app/checkpoints/default; mount a volume there
# (or set DYGSERVE_CHECKPOINT) to serve another one.

ARG PYTHON_VERSION=3.11
ARG TORCH_VERSION=2.13.0
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

# ---------------------------------------------------------------- CPU: build the venv
FROM python:${PYTHON_VERSION}-slim AS cpu-build
ARG TORCH_VERSION
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install --upgrade pip \
 && pip install --index-url https://download.pytorch.org/whl/cpu torch==${TORCH_VERSION}
WORKDIR /src
COPY pyproject.toml README.md ./
COPY state_store ./state_store
COPY model ./model
COPY service ./service
COPY training ./training
COPY loadtests ./loadtests
# Serving and its onnxruntime backend only; `pip install '.[train]'` or '.[bench]' adds
# the offline trainer's or the benches' plotting on top.
RUN pip install '.[onnx]' \
 && python -c "import torch; assert torch.__version__.split('+')[0] == '${TORCH_VERSION}', torch.__version__"

# ---------------------------------------------------------------- GPU image
# onnxruntime-gpu REPLACES onnxruntime (same import package; never install both), so
# the base dependencies are installed from a list with onnxruntime swapped for the gpu
# extra (deploy/gpu_requirements.py), and the package itself with --no-deps.
# mamba-ssm / causal-conv1d are sdist-only: installed best effort without compiling
# their CUDA kernels. The service does not call them (README "What is not there yet":
# their fused scan cannot express this model's recurrence); on CUDA it runs its own
# PyTorch kernels either way.
FROM ${CUDA_IMAGE} AS gpu
ARG TORCH_VERSION
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch from PyPI: the Linux x86_64 wheels there are the CUDA builds
RUN pip install --upgrade pip setuptools wheel packaging ninja \
 && pip install torch==${TORCH_VERSION}
WORKDIR /src
COPY pyproject.toml README.md ./
COPY deploy/gpu_requirements.py ./deploy/gpu_requirements.py
RUN python deploy/gpu_requirements.py pyproject.toml > /tmp/requirements-gpu.txt \
 && cat /tmp/requirements-gpu.txt \
 && pip install -r /tmp/requirements-gpu.txt
COPY state_store ./state_store
COPY model ./model
COPY service ./service
COPY training ./training
COPY loadtests ./loadtests
RUN pip install --no-deps .
# best effort: the service does not depend on them
RUN MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE \
    CAUSAL_CONV1D_FORCE_BUILD=TRUE CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE \
    pip install --no-build-isolation $(python deploy/gpu_requirements.py --optional pyproject.toml) \
 || echo "NOTE: mamba-ssm/causal-conv1d not installed (the service does not use them)"
# onnxruntime and onnxruntime-gpu must never be co-installed
RUN python deploy/gpu_requirements.py --check-onnxruntime
RUN useradd --system --uid 10001 --user-group --home-dir /app --create-home --shell /usr/sbin/nologin app \
 && mkdir -p /app/checkpoints /app/models \
 && chown -R app:app /app
WORKDIR /app
COPY --chown=app:app checkpoints/default /app/checkpoints/default
ENV DYGSERVE_CHECKPOINT=/app/checkpoints/default \
    DYGSERVE_MODELS_DIR=/app/models
USER app
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request, sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=4).status == 200 else 1)"]
CMD ["dygserve", "serve", "--host", "0.0.0.0", "--port", "8000"]

# ---------------------------------------------------------------- CPU runtime (default target: last stage)
FROM python:${PYTHON_VERSION}-slim AS cpu
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    OMP_NUM_THREADS=1 \
    DYGSERVE_CHECKPOINT=/app/checkpoints/default \
    DYGSERVE_MODELS_DIR=/app/models
COPY --from=cpu-build /opt/venv /opt/venv
RUN useradd --system --uid 10001 --user-group --home-dir /app --create-home --shell /usr/sbin/nologin app \
 && mkdir -p /app/checkpoints /app/models \
 && chown -R app:app /app
WORKDIR /app
COPY --chown=app:app checkpoints/default /app/checkpoints/default
USER app
EXPOSE 8000
# no curl in the slim image: probe readiness with the standard library
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request, sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=4).status == 200 else 1)"]
CMD ["dygserve", "serve", "--host", "0.0.0.0", "--port", "8000"]
