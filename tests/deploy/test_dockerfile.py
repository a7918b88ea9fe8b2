"""The Dockerfile and .dockerignore, checked by parsing (no Docker engine needed)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
GPU_REQS = REPO / "deploy" / "gpu_requirements.py"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (KEYWORD, arguments)

    def all(self, keyword: str) -> list[str]:
        return [a for k, a in self.instructions if k == keyword]

    def last(self, keyword: str) -> str | None:
        found = self.all(keyword)
        return found[-1] if found else None


def parse_dockerfile(path: Path = DOCKERFILE) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages): continuation lines joined, comments dropped."""
    lines: list[str] = []
    buf = ""
    for raw in path.read_text().splitlines():
        s = raw.strip()
        if not buf and (not s or s.startswith("#")):
            continue
        if buf and s.startswith("#"):
            continue  # comment inside a continued instruction
        if s.endswith("\\"):
            buf += s[:-1].rstrip() + " "
            continue
        lines.append(buf + s)
        buf = ""
    if buf:
        lines.append(buf)
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        kw, _, rest = line.partition(" ")
        kw, rest = kw.upper(), rest.strip()
        if kw == "FROM":
            m = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
            assert m, line
            stages.append(Stage(m.group(1), m.group(2)))
        elif not stages:
            assert kw == "ARG", f"only ARG may come before the first FROM: {line}"
            name, _, default = rest.partition("=")
            args[name] = default
        else:
            stages[-1].instructions.append((kw, rest))
    return args, stages


def expand(value: str, args: dict[str, str]) -> str:
    return re.sub(
        r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), value
    )


def stage_args(stage: Stage, global_args: dict[str, str]) -> dict[str, str]:
    """ARGs visible in a stage (a bare ``ARG X`` re-imports the global default)."""
    out: dict[str, str] = {}
    for a in stage.all("ARG"):
        name, eq, default = a.partition("=")
        out[name] = default if eq else global_args.get(name, "")
    return out


def run_lines(stage: Stage) -> list[str]:
    return stage.all("RUN")


def exec_form(arg: str) -> list[str]:
    arg = arg.strip()
    if arg.startswith("["):
        return json.loads(arg)
    return shlex.split(arg)


@pytest.fixture(scope="module")
def parsed():
    return parse_dockerfile()


@pytest.fixture(scope="module")
def stages(parsed) -> dict[str, Stage]:
    return {s.name: s for s in parsed[1]}


# --------------------------------------------------------------------------- the images


def test_multi_stage_default_target_is_slim_cpu(parsed):
    args, st = parsed
    assert len(st) >= 4, "expected the CPU build and runtime, the GPU build and the gpu image"
    names = [s.name for s in st]
    assert "gpu" in names and "gpu-build" in names
    default = st[-1]  # `docker build` without --target builds the last stage
    assert default.name != "gpu"
    assert expand(default.base, args) == "python:3.11-slim"
    assert default.last("COPY") is not None
    assert any("--from=" in c for c in default.all("COPY")), (
        "the runtime should copy the built venv"
    )
    assert expand(stages_by_name(st)["gpu"].base, args).startswith("nvidia/cuda:")
    assert "runtime" in expand(stages_by_name(st)["gpu"].base, args)
    # the kernels compile on the devel image of the same CUDA and Ubuntu (same python3)
    devel = expand(stages_by_name(st)["gpu-build"].base, args)
    assert devel == expand(stages_by_name(st)["gpu"].base, args).replace("runtime", "devel")
    assert any("--from=gpu-build /opt/venv" in c for c in stages_by_name(st)["gpu"].all("COPY"))


def stages_by_name(st: list[Stage]) -> dict[str, Stage]:
    return {s.name: s for s in st}


@pytest.mark.parametrize("target", ["default", "gpu"])
def test_final_images_run_as_non_root_with_healthcheck(parsed, target):
    args, st = parsed
    stage = st[-1] if target == "default" else stages_by_name(st)["gpu"]
    user = stage.last("USER")
    assert user is not None, f"{target}: no USER"
    assert user.split(":")[0] not in ("root", "0"), user
    # the user is created in the stage, before it is switched to
    assert any("useradd" in r or "adduser" in r for r in run_lines(stage))
    hc = stage.last("HEALTHCHECK")
    assert hc and "/readyz" in hc and "urllib" in hc and "curl" not in hc
    cmd_part = hc.split("CMD", 1)[1]
    probe = exec_form(cmd_part)
    assert probe[0] == "python" and probe[1] == "-c"
    compile(probe[2], "<healthcheck>", "exec")  # the probe is valid Python
    assert "8000" in stage.last("EXPOSE").split()
    assert exec_form(stage.last("CMD")) == [
        "dygserve",
        "serve",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
    ]
    copies = [c for c in stage.all("COPY") if "checkpoints/default" in c]
    assert copies and copies[-1].split()[-2:] == ["checkpoints/default", "/app/checkpoints/default"]
    # non-root user owns the checkpoint copy; the USER switch comes after the root-only steps
    kws = [k for k, _ in stage.instructions]
    assert max(i for i, k in enumerate(kws) if k == "RUN") < kws.index("USER")


# `pip install .` or `pip install '.[extra,...]'`: the package itself
PACKAGE_INSTALL = re.compile(r"pip install '?\.(\[[\w,]+\])?'?(\s|$)")


def test_torch_pinned_and_installed_first(parsed):
    args, st = parsed
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    (pin,) = [d for d in pyproject["project"]["dependencies"] if re.match(r"torch\b", d)]
    assert pin == "torch==2.13.0"
    assert args["TORCH_VERSION"] == "2.13.0"
    assert "torch==2.13.0" in (REPO / "Makefile").read_text()
    build = next(
        s for s in st if any(PACKAGE_INSTALL.search(r) for r in run_lines(s)) and s.name != "gpu"
    )
    runs = [expand(r, {**args, **stage_args(build, args)}) for r in run_lines(build)]
    torch_i = next(i for i, r in enumerate(runs) if "torch==2.13.0" in r)
    assert "--index-url https://download.pytorch.org/whl/cpu" in runs[torch_i]
    pkg_i = next(i for i, r in enumerate(runs) if PACKAGE_INSTALL.search(r))
    assert torch_i < pkg_i, "torch must be installed before the package (as in the Makefile)"
    gpu = stages_by_name(st)["gpu-build"]
    gpu_runs = [expand(r, {**args, **stage_args(gpu, args)}) for r in run_lines(gpu)]
    torch_gpu = next(i for i, r in enumerate(gpu_runs) if "torch==2.13.0" in r)
    # torch's CUDA build (its index named, CUDA 13 as onnxruntime-gpu wants), before the
    # requirements and the kernels that need it
    assert "--index-url https://download.pytorch.org/whl/cu130" in gpu_runs[torch_gpu]
    assert torch_gpu < next(i for i, r in enumerate(gpu_runs) if "requirements-gpu" in r)
    assert "13.0" in args["CUDA_RUNTIME_IMAGE"] and "13.0" in args["CUDA_DEVEL_IMAGE"]


def _pip_installs(run: str) -> list[list[str]]:
    """The argument lists of every `pip install` in a RUN line."""
    out = []
    for part in re.split(r"&&|\|\||;", run):
        words = part.split()
        for i in range(len(words) - 1):
            if words[i].endswith("pip") and words[i + 1] == "install":
                out.append(words[i + 2 :])
    return out


def test_gpu_target_never_co_installs_onnxruntime(stages):
    gpu = stages["gpu-build"]
    assert not any("pip install" in r for r in run_lines(stages["gpu"])), (
        "the image copies the venv"
    )
    for run in run_lines(gpu):
        for argv in _pip_installs(run):
            pkgs = [a.strip("'\"") for a in argv if not a.startswith("-")]
            names = {re.split(r"[<>=!~\[;]", p)[0].lower() for p in pkgs}
            assert not {"onnxruntime", "onnxruntime-gpu"} <= names, run
            assert not any(re.search(r"\.\[[^\]]*gpu", p) for p in pkgs), (
                f"'.[gpu]' pulls onnxruntime too: {run}"
            )
            if "." in pkgs:
                assert "--no-deps" in argv, f"the package's own deps name onnxruntime: {run}"
    joined = " ".join(run_lines(gpu))
    assert "gpu_requirements.py" in joined and "--check-onnxruntime" in joined
    mamba = [r for r in run_lines(gpu) if "MAMBA_FORCE_BUILD=" in r]
    assert len(mamba) == 1, "one mamba-ssm step"
    step = mamba[0]
    # the CUDA kernels are compiled (not skipped), in parallel, and required
    assert "MAMBA_SKIP_CUDA_BUILD=FALSE" in step and "CAUSAL_CONV1D_SKIP_CUDA_BUILD=FALSE" in step
    assert "--no-build-isolation" in step and "MAX_JOBS=" in step and "||" not in step
    assert "selective_scan_cuda" in step and "causal_conv1d_cuda" in step
    # ... for the named architectures: their setup.py cut down to TORCH_CUDA_ARCH_LIST
    assert 'kernel_arches.py "${TORCH_CUDA_ARCH_LIST}" */setup.py' in step
    assert "--no-binary=:all:" in step and "KERNELS_PREBUILT" in step


def test_gpu_build_args_have_defaults(parsed):
    args, _ = parsed
    for name in ("TORCH_CUDA_INDEX", "TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "KERNELS_PREBUILT"):
        assert args.get(name), name
    assert args["KERNELS_PREBUILT"] in ("TRUE", "FALSE")
    assert "9.0" in args["TORCH_CUDA_ARCH_LIST"]  # H100/H200


KERNEL_ARCHES = REPO / "deploy" / "kernel_arches.py"
# The layout of mamba-ssm 2.3's and causal-conv1d 1.7's setup.py (written here, not copied).
SETUP_PY = """
cc_flag = []
if not SKIP:
    cc_flag.append("-gencode")
    cc_flag.append("arch=compute_80,code=sm_80")
    if version >= 11.8:
        cc_flag.append("-gencode")
        cc_flag.append("arch=compute_90,code=sm_90")
    if version >= 12.8:
        cc_flag.append("-gencode")
        cc_flag.append("arch=compute_100,code=sm_100")
        cc_flag.append("-gencode")
        cc_flag.append("arch=compute_120,code=sm_120")
"""


def test_kernel_arches_keeps_only_the_named_architectures(tmp_path):
    setup = tmp_path / "setup.py"
    setup.write_text(SETUP_PY)
    r = subprocess.run(
        [sys.executable, str(KERNEL_ARCHES), "9.0+PTX", str(setup)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    out = setup.read_text()
    assert "code=sm_90" in out and "sm_80" not in out and "sm_100" not in out
    assert "sm_120" not in out and out.count('cc_flag.append("-gencode")') == 1
    namespace: dict = {"SKIP": False, "version": 13.0}
    exec(out, namespace)  # the emptied if-blocks hold `pass`: it still runs
    assert namespace["cc_flag"] == ["-gencode", "arch=compute_90,code=sm_90"]
    two = tmp_path / "two.py"
    two.write_text(SETUP_PY)
    subprocess.run([sys.executable, str(KERNEL_ARCHES), "8.0;10.0", str(two)], check=True)
    assert "sm_80" in two.read_text() and "sm_100" in two.read_text()
    assert "sm_90" not in two.read_text()
    for text, arch in ((SETUP_PY, "7.5"), ("print('no gencode here')", "9.0")):
        bad = tmp_path / "bad.py"
        bad.write_text(text)
        r = subprocess.run(
            [sys.executable, str(KERNEL_ARCHES), arch, str(bad)], capture_output=True, text=True
        )
        assert r.returncode != 0 and bad.read_text() == text  # refused, file untouched


def test_gpu_requirements_swap_onnxruntime():
    def run(*a: str) -> str:
        r = subprocess.run(
            [sys.executable, str(GPU_REQS), *a, str(REPO / "pyproject.toml")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        return r.stdout

    reqs = run().split()
    names = [re.split(r"[<>=!~\[;]", r)[0].lower() for r in reqs]
    assert "onnxruntime-gpu" in names and "onnxruntime" not in names
    assert "torch" not in names and "mamba-ssm" not in names and "causal-conv1d" not in names
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for dep in pyproject["dependencies"]:  # everything else of the base deps is kept
        n = re.split(r"[<>=!~\[;]", dep)[0].lower()
        if n not in ("torch", "onnxruntime"):
            assert n in names, n
    optional = run("--optional").split()
    assert {re.split(r"[<>=!~\[;]", r)[0] for r in optional} == {"mamba-ssm", "causal-conv1d"}
    assert not any("'" in o or '"' in o for o in optional)
    r = subprocess.run(
        [sys.executable, str(GPU_REQS), "--check-onnxruntime"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr  # this environment has the CPU build only


# --------------------------------------------------------------------------- .dockerignore


def dockerignore_rules(path: Path = DOCKERIGNORE) -> list[tuple[bool, re.Pattern[str]]]:
    """(negated, regex) per rule, in order (Go filepath.Match plus ``**``)."""
    rules = []
    for raw in path.read_text().splitlines():
        s = raw.strip()
        if not s or s.startswith("#"):
            continue
        neg = s.startswith("!")
        pat = s[1:].strip() if neg else s
        pat = pat.strip("/")
        rx = ""
        i = 0
        while i < len(pat):
            if pat.startswith("**/", i):
                rx += "(?:.*/)?"
                i += 3
            elif pat.startswith("**", i):
                rx += ".*"
                i += 2
            elif pat[i] == "*":
                rx += "[^/]*"
                i += 1
            elif pat[i] == "?":
                rx += "[^/]"
                i += 1
            else:
                rx += re.escape(pat[i])
                i += 1
        rules.append((neg, re.compile(rx + r"\Z")))
    return rules


def is_ignored(rel: str, rules=None) -> bool:
    """Whether .dockerignore keeps ``rel`` (a path in the context) out: the last rule
    matching the path or one of its parent folders decides."""
    rules = dockerignore_rules() if rules is None else rules
    parts = rel.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for neg, rx in rules:
        if any(rx.match(p) for p in prefixes):
            ignored = not neg
    return ignored


def test_dockerignore_matcher():
    rules = dockerignore_rules()
    assert is_ignored(".venv/bin/python", rules) and is_ignored("model/__pycache__/x.pyc", rules)
    assert not is_ignored("model/ssm.py", rules)


def test_dockerignore_keeps_what_the_build_copies(parsed):
    _, st = parsed
    sources = set()
    for stage in st:
        for c in stage.all("COPY"):
            words = [w for w in c.split() if not w.startswith("--")]
            if any(w.startswith("--from") for w in c.split()):
                continue
            sources.update(words[:-1])
    assert {
        "model",
        "service",
        "state_store",
        "pyproject.toml",
        "README.md",
        "checkpoints/default",
    } <= sources
    for src in sources:
        assert not is_ignored(src), f".dockerignore excludes {src}, which the Dockerfile copies"
        assert not is_ignored(f"{src}/x.py") or not (REPO / src).is_dir(), src
    for pkg in ("model", "service", "state_store", "training", "loadtests"):
        assert (REPO / pkg).is_dir(), pkg
        assert pkg in sources, f"package {pkg} (pyproject packages.find) is not copied"
    assert (REPO / "deploy" / "gpu_requirements.py").is_file()
    assert (REPO / "deploy" / "kernel_arches.py").is_file()


def test_dockerignore_excludes_local_state():
    for p in (
        ".git/HEAD",
        ".venv/bin/python",
        "runs/load/report.json",
        "tests/conftest.py",
        "model/__pycache__/ssm.cpython-311.pyc",
        "checkpoints/other/weights.safetensors",
        ".pytest_cache/v",
        "deploy/docker-compose.yml",
        "dygserve.egg-info/PKG-INFO",
    ):
        assert is_ignored(p), p
    assert not is_ignored("checkpoints/default/weights.safetensors")
    assert not is_ignored("deploy/gpu_requirements.py")
    assert not is_ignored("deploy/kernel_arches.py")
