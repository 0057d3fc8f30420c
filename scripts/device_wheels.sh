#!/usr/bin/env bash
# On the GPU host (repo root, with .whl carried), install these wheels with:
# python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH
# (console scripts land in /tmp/site/bin: run `python3 -m snakemake ...`, or add `export PATH=/tmp/site/bin:$PATH`;
#  under `set -u` with PYTHONPATH unset, write `export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}` instead.)
#
# Fills .whl/ (git-ignored) with exactly the wheels the device host (Python 3.12, x86-64, manylinux;
# torch, transformers, numpy, pandas, ... already installed, nothing downloadable) lacks to run
# `snakemake` on this workflow: snakemake and everything it needs, gunicorn (reward service),
# jsonschema, tenacity (the reward client's retries) and pebble (math-verify's workers), at the versions of requirements-lock.txt. The set is derived from the wheels' own
# Requires-Dist, recursively (extras skipped, markers evaluated for CPython 3.12 on Linux x86-64),
# leaving out every package the host image already has (HOST_PACKAGES below, from the device
# tool's KINDS.md, "Python packages already there"). Binary wheels are the cp312 manylinux ones.
# Run it here (where PyPI is reachable), from anywhere in the checkout: bash scripts/device_wheels.sh
set -euo pipefail

cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEST=.whl
LOCK=requirements-lock.txt
# What the workflow itself needs on the host beyond what is there; the rest follows from metadata.
ROOTS=(snakemake gunicorn jsonschema tenacity pebble)

# The device image's packages (KINDS.md, read 2026-11-17): used as they are, never carried.
HOST_PACKAGES="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops
equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11
h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax
jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning
lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib
mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver
nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13
nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx
optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools
shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl
zipp"
# Never carried even if something asked for them: the host's own builds are the ones used.
NEVER="torch triton transformers tokenizers huggingface-hub safetensors numpy"
# Carried although the host has it, since its version there is unread and an old one breaks the
# set: pydantic_core (sqlmodel -> snakemake's persistence) imports typing_extensions.Sentinel (4.14+)
# and pydantic asks typing-extensions>=4.16.0; with 4.12 `snakemake` fails on import. The lock's
# 4.16.0 is backward compatible for the host's torch & co. Override with CARRY_ANYWAY="" to skip.
CARRY_ANYWAY=${CARRY_ANYWAY-typing-extensions}

STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT

HOST_PACKAGES="$HOST_PACKAGES" NEVER="$NEVER" CARRY_ANYWAY="$CARRY_ANYWAY" STAGE="$STAGE" LOCK="$LOCK" \
"$PY" - "${ROOTS[@]}" <<'PYEOF'
import glob, os, re, subprocess, sys, zipfile
from email.parser import Parser
try:
    from packaging.markers import Marker
    from packaging.requirements import Requirement
except ImportError:  # pip always carries a copy
    from pip._vendor.packaging.markers import Marker
    from pip._vendor.packaging.requirements import Requirement

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

# The device host's interpreter, for environment markers.
ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
       "implementation_version": "3.12.3", "platform_python_implementation": "CPython",
       "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
       "platform_machine": "x86_64", "extra": ""}
PIP_TARGET = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64"]
for p in PLATFORMS:
    PIP_TARGET += ["--platform", p]

stage, lock_path = os.environ["STAGE"], os.environ["LOCK"]
anyway = [norm(n) for n in os.environ["CARRY_ANYWAY"].split()]
host = {norm(n) for n in os.environ["HOST_PACKAGES"].split()} - set(anyway)
never = {norm(n) for n in os.environ["NEVER"].split()}
lock = {}
for line in open(lock_path):
    line = line.split("#", 1)[0].strip()
    if line:
        name, _, ver = line.partition("==")
        lock[norm(name)] = (name.strip(), ver.strip())

def fetch(key):
    """Download NAME==lockversion into its own folder under the stage; returns the wheel's path."""
    name, ver = lock[key]
    d = os.path.join(stage, key)
    os.makedirs(d)
    base = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--disable-pip-version-check", "-d", d]
    r = subprocess.run(base + PIP_TARGET + [f"{name}=={ver}"], capture_output=True, text=True)
    if r.returncode != 0:
        # No cp312/manylinux or py3 wheel on the index: build one from the sdist, and accept it
        # only if it is pure Python (runs on any interpreter).
        r2 = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check",
                             "-w", d, f"{name}=={ver}"], capture_output=True, text=True)
        if r2.returncode != 0:
            sys.exit(f"device_wheels: no wheel for {name}=={ver}:\n{r.stderr}\n{r2.stderr}")
    whls = glob.glob(os.path.join(d, "*.whl"))
    if len(whls) != 1:
        sys.exit(f"device_wheels: expected one wheel for {name}=={ver}, got {whls}")
    tag = os.path.basename(whls[0])[:-4].split("-")[-3:]
    if r.returncode != 0 and tag[1:] != ["none", "any"]:
        sys.exit(f"device_wheels: {name}=={ver} has no cp312 manylinux wheel and built as {whls[0]}")
    return whls[0]

def requires(whl):
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        msg = Parser().parsestr(z.read(meta).decode("utf-8"))
    for spec in msg.get_all("Requires-Dist") or []:
        req = Requirement(spec)
        # ENV chooses no extra, so `extra == "..."` lines are skipped; other markers as on the host.
        if req.marker is not None and not req.marker.evaluate(ENV):
            continue
        yield req

def slim_pulp(whl):
    """PuLP's wheel bundles CBC solver binaries for six platforms (16 MB); keep only linux/i64, the
    host's (Snakemake's ILP scheduler calls it), dropping the rest from the archive and its RECORD."""
    drop = lambda n: n.startswith("pulp/solverdir/cbc/") and not n.startswith("pulp/solverdir/cbc/linux/i64/")
    tmp = whl + ".tmp"
    with zipfile.ZipFile(whl) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            if drop(info.filename):
                continue
            data = zin.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = "".join(l for l in data.decode().splitlines(True) if not drop(l.split(",", 1)[0])).encode()
            zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)  # info keeps modes (cbc stays executable)
    os.replace(tmp, whl)

queue = [norm(r) for r in sys.argv[1:]] + anyway
seen, wheels, why, host_reqs = set(), {}, {}, {}
for r in queue:
    why[r] = "carried anyway, see CARRY_ANYWAY" if r in anyway else "root"
while queue:
    key = queue.pop(0)
    if key in seen:
        continue
    seen.add(key)
    if key not in lock:
        sys.exit(f"device_wheels: {key} (needed by {why[key]}) is not in {lock_path}")
    whl = fetch(key)
    if key == "pulp":
        slim_pulp(whl)
    name, ver = lock[key]
    wheels[key] = whl
    for req in requires(whl):
        dep = norm(req.name)
        if dep in host or dep in never:
            host_reqs.setdefault(dep, set()).add(f"{req.name}{req.specifier} ({name})")
            continue
        if dep in seen or dep in queue:
            continue
        if dep in lock and not req.specifier.contains(lock[dep][1], prereleases=True):
            sys.exit(f"device_wheels: {name} asks {req}, lock has {lock[dep][1]}")
        why[dep] = f"{name}=={ver}"
        queue.append(dep)

print("Taken from the host as it is (what the carried wheels ask of it):")
for dep in sorted(host_reqs):
    print(f"  {dep}: " + "; ".join(sorted(host_reqs[dep])))
with open(os.path.join(stage, "LIST"), "w") as f:
    for key in sorted(wheels):
        f.write(f"{wheels[key]}\t{why[key]}\n")
PYEOF

mkdir -p "$DEST"
rm -f "$DEST"/*.whl
while IFS=$'\t' read -r whl why; do
  mv "$whl" "$DEST"/
  printf '%8s  %-70s  (%s)\n' "$(du -k "$DEST/$(basename "$whl")" | cut -f1)K" "$(basename "$whl")" "$why"
done < "$STAGE/LIST"
echo "$(ls "$DEST"/*.whl | wc -l) wheels in $DEST, total $(du -ch "$DEST"/*.whl | tail -1 | cut -f1) ($(cat "$DEST"/*.whl | wc -c) bytes)"
