# dygserve images.
#
#   docker build -t dygserve .                    # default target: slim CPU image
#   docker build --target gpu -t dygserve:gpu .   # CUDA image: onnxruntime-gpu, mamba-ssm's kernels
#   docker build --target gpu --build-arg TORCH_CUDA_ARCH_LIST=9.0 --build-arg MAX_JOBS=16 -t dygserve:gpu .
#
# The install follows the Makefile: torch first, exactly pinned (from the CPU wheel
# index for the CPU image, so pip never pulls the multi-GB CUDA build; from the CUDA
# index for the GPU image), then the package itself.
# The bundled checkpoint is copied to /app/checkpoints/default; mount a volume there
# (or set DYGSERVE_CHECKPOINT) to serve another one.

ARG PYTHON_VERSION=3.11
ARG TORCH_VERSION=2.13.0
# GPU target: torch's CUDA 13.0 build, and CUDA images of the same version (nvcc must
# match torch's CUDA to compile mamba-ssm; onnxruntime-gpu 1.31 wants CUDA 13 + cuDNN 9).
ARG TORCH_CUDA_INDEX=https://download.pytorch.org/whl/cu130
ARG CUDA_DEVEL_IMAGE=nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04
ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04
# Compute capabilities to compile the kernels for: 8.0 = A100, 9.0 = H100/H200, e.g.
# --build-arg TORCH_CUDA_ARCH_LIST=9.0 for H100/H200 only.
ARG TORCH_CUDA_ARCH_LIST="8.0;9.0"
ARG MAX_JOBS=8
ARG KERNELS_PREBUILT=FALSE

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

# ---------------------------------------------------------------- GPU: build the venv
# onnxruntime-gpu REPLACES onnxruntime (same import package; never install both), so
# the base dependencies are installed from a list with onnxruntime swapped for the gpu
# extra (deploy/gpu_requirements.py), and the package itself with --no-deps.
# mamba-ssm and causal-conv1d are sdist-only: their CUDA kernels are compiled here, on a
# devel image whose nvcc matches torch's CUDA (13.0 for torch's cu130 wheels and
# onnxruntime-gpu 1.31's CUDA 13 / cuDNN 9), for TORCH_CUDA_ARCH_LIST only, with MAX_JOBS
# parallel nvcc jobs (each can take several GB of memory).
# Measured outside Docker on H100 and H200 machines with 16 cores (docs/GPU.md): for sm_90
# alone at MAX_JOBS=16, mamba-ssm built in 2-3 min and causal-conv1d in about 5 min (its
# slowest file is one nvcc job, so more jobs do not shorten it). Estimates (no Docker engine where this was
# written): 15-30 min for two architectures at MAX_JOBS=8 (their own list of nine would
# take several times that); an image of about 9-11 GB (torch's CUDA build with its
# nvidia-* libraries ~5 GB, the CUDA/cuDNN runtime base ~3 GB, triton ~1 GB,
# onnxruntime-gpu ~0.5 GB, the compiled kernels ~0.1 GB per architecture).
FROM ${CUDA_DEVEL_IMAGE} AS gpu-build
ARG TORCH_VERSION
ARG TORCH_CUDA_INDEX
ARG TORCH_CUDA_ARCH_LIST
ARG MAX_JOBS
ARG KERNELS_PREBUILT
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential git \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch's CUDA build, exactly pinned, before anything that names torch
RUN pip install --upgrade pip setuptools wheel packaging ninja \
 && pip install --index-url ${TORCH_CUDA_INDEX} torch==${TORCH_VERSION} \
 && python -c "import torch; assert torch.__version__.split('+')[0] == '${TORCH_VERSION}' and torch.version.cuda, torch.__version__"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY deploy/gpu_requirements.py ./deploy/gpu_requirements.py
RUN python deploy/gpu_requirements.py pyproject.toml > /tmp/requirements-gpu.txt \
 && cat /tmp/requirements-gpu.txt \
 && pip install -r /tmp/requirements-gpu.txt
# The kernels the service calls on CUDA (model/kernels/): required, the build fails without
# them. By default the sdists are fetched, their setup.py cut down to the -gencode pairs of
# TORCH_CUDA_ARCH_LIST (deploy/kernel_arches.py: their own list would override it), and
# compiled; KERNELS_PREBUILT=TRUE installs them as their setup.py does by default instead
# (a prebuilt wheel from the projects' GitHub releases where one matches this
# torch/CUDA/Python, else a compile for their whole list of architectures).
COPY deploy/kernel_arches.py ./deploy/kernel_arches.py
RUN mkdir /tmp/kernels && cd /tmp/kernels \
 && KERNELS="$(python /src/deploy/gpu_requirements.py --optional /src/pyproject.toml)" \
 && if [ "${KERNELS_PREBUILT}" = "TRUE" ]; then \
        MAX_JOBS=${MAX_JOBS} MAMBA_FORCE_BUILD=FALSE MAMBA_SKIP_CUDA_BUILD=FALSE \
        CAUSAL_CONV1D_FORCE_BUILD=FALSE CAUSAL_CONV1D_SKIP_CUDA_BUILD=FALSE \
        pip install --no-build-isolation $KERNELS; \
    else \
        MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE \
        CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE CAUSAL_CONV1D_FORCE_BUILD=TRUE \
        pip download --no-deps --no-build-isolation --no-binary=:all: $KERNELS \
     && for f in *.tar.gz; do tar xzf "$f"; done \
     && python /src/deploy/kernel_arches.py "${TORCH_CUDA_ARCH_LIST}" */setup.py \
     && MAX_JOBS=${MAX_JOBS} MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=FALSE \
        CAUSAL_CONV1D_FORCE_BUILD=TRUE CAUSAL_CONV1D_SKIP_CUDA_BUILD=FALSE \
        pip install --no-build-isolation ./causal_conv1d-*/ ./mamba_ssm-*/; \
    fi \
 && cd / && rm -rf /tmp/kernels \
 && python -c "import importlib.util as u, sys; sys.exit(0 if u.find_spec('selective_scan_cuda') and u.find_spec('causal_conv1d_cuda') else 1)"
COPY state_store ./state_store
COPY model ./model
COPY service ./service
COPY training ./training
COPY loadtests ./loadtests
RUN pip install --no-deps .
# onnxruntime and onnxruntime-gpu must never be co-installed
RUN python deploy/gpu_requirements.py --check-onnxruntime

# ---------------------------------------------------------------- GPU image
# The built venv on the runtime image of the same CUDA and Ubuntu (same python3). At
# start the service logs, and /v1/model and dygserve_kernel_path show, which path
# advances states: mamba-ssm on a GPU the kernels were built for.
FROM ${CUDA_RUNTIME_IMAGE} AS gpu
ENV DEBIAN_FRONTEND=noninteractive \
    PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    DYGSERVE_DEVICE=auto \
    DYGSERVE_CHECKPOINT=/app/checkpoints/default \
    DYGSERVE_MODELS_DIR=/app/models
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /app --create-home --shell /usr/sbin/nologin app \
 && mkdir -p /app/checkpoints /app/models \
 && chown -R app:app /app
COPY --from=gpu-build /opt/venv /opt/venv
WORKDIR /app
COPY --chown=app:app checkpoints/default /app/checkpoints/default
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
