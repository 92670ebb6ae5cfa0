#!/usr/bin/env bash
# Set up everything `make bench` needs that the project's .venv does not have, under one cache folder
# (default bench/.cache, git-ignored). Idempotent: each step is skipped when its stamp exists. Nothing is
# installed system-wide.
#   venv-mlserver/   MLServer 1.7.1 (uvloop 0.21.0: 0.23 crashes its default parallel-workers mode)
#   venv-kserve/     KServe 0.21.0
#   venv-triton/     nvidia-pytriton 0.7.0: only for the `tritonserver` 2.51 binary and Python backend it ships
#                    (about 370 MB; the models in bench/servers/triton_repo run in its Python-backend stub)
#   venv-tools/      py-spy (profiling)
#   triton/          tritonserver's backends folder as PyTriton lays it out: the wheel's Python backend plus the
#                    Python-backend stub built for this interpreter's minor version (bench/servers.py starts it)
#   perf_analyzer/   the perf-analyzer 2.60.0 wheel, unpacked (its binary needs glibc 2.38: see debian13/)
#   debian13/        Debian 13's libc6, libstdc++6, libgcc-s1, libssl3t64, zlib1g, unpacked (not installed),
#                    fetched with a private apt state; perf_analyzer runs through its ld-linux (bench/pa.py)
# Usage: bash bench/setup.sh [CACHE]      (PYTHON=python3.11 to choose the interpreter of the venvs;
#        BENCH_SETUP_ONLY=perf_analyzer or BENCH_SETUP_ONLY=triton for that piece alone: the test suite uses them)
set -euo pipefail

CACHE="${1:-${BENCH_CACHE:-$(dirname "$0")/.cache}}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$CACHE"
CACHE="$(cd "$CACHE" && pwd)"

MLSERVER_VERSION=1.7.1
KSERVE_VERSION=0.21.0
PA_VERSION=2.60.0
PYSPY_VERSION=0.4.3
PYTRITON_VERSION=0.7.0

pip_quiet=(--quiet --disable-pip-version-check --no-input)
# uv (installed into the checkout's .venv by `make build`) fills a venv in seconds where pip takes a minute; pip
# when there is none.
UV="${UV:-$(dirname "$0")/../.venv/bin/uv}"

venv() {  # venv NAME PACKAGE...
    local name="$1"; shift
    local dir="$CACHE/venv-$name"
    if [[ -f "$dir/.installed" ]]; then return; fi
    echo "setup: $dir <- $*"
    rm -rf "$dir"
    "$PYTHON" -m venv "$dir"
    if [[ -x "$UV" ]]; then
        timeout 900 "$UV" pip install --quiet --compile-bytecode --python "$dir/bin/python" "$@"
    else
        timeout 900 "$dir/bin/python" -m pip install "${pip_quiet[@]}" "$@"
    fi
    touch "$dir/.installed"
}

ONLY="${BENCH_SETUP_ONLY:-}"
want() { [[ -z "$ONLY" || "$ONLY" == "$1" ]]; }

if want peers; then
    venv mlserver "mlserver==$MLSERVER_VERSION" "uvloop==0.21.0"
    venv kserve "kserve==$KSERVE_VERSION"
    venv tools "py-spy==$PYSPY_VERSION"
fi
if want triton; then
    venv triton "nvidia-pytriton==$PYTRITON_VERSION"
fi

# Triton: the wheel ships one Python-backend stub per Python minor version; the backend expects its stub beside it.
TRITON="$CACHE/triton"
if want triton && [[ ! -f "$TRITON/.installed" ]]; then
    echo "setup: Triton backends folder"
    dist="$("$CACHE/venv-triton/bin/python" -c 'import pathlib, pytriton; print(pathlib.Path(pytriton.__file__).parent / "tritonserver")')"
    minor="$("$CACHE/venv-triton/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
    rm -rf "$TRITON" && mkdir -p "$TRITON/backends"
    cp -r "$dist/backends/python" "$TRITON/backends/python"
    cp "$dist/python_backend_stubs/$minor/triton_python_backend_stub" "$TRITON/backends/python/"
    ln -s "$dist/bin/tritonserver" "$TRITON/tritonserver"
    [[ "$("$TRITON/tritonserver" --help 2>&1 || true)" == *Usage* ]] || { echo "setup: tritonserver does not run" >&2; exit 1; }
    touch "$TRITON/.installed"
fi

# perf_analyzer: every real wheel is tagged manylinux_2_38 (pip refuses it on glibc 2.36), so fetch it for that
# platform and unpack it without installing.
PA="$CACHE/perf_analyzer"
if want perf_analyzer && [[ ! -f "$PA/.installed" ]]; then
    echo "setup: perf-analyzer $PA_VERSION wheel"
    rm -rf "$PA" && mkdir -p "$PA/wheel"
    timeout 600 "$PYTHON" -m pip download "${pip_quiet[@]}" --no-deps --only-binary=:all: \
        --platform manylinux_2_38_x86_64 --python-version 3.11 -d "$PA/wheel" "perf-analyzer==$PA_VERSION"
    "$PYTHON" -m zipfile -e "$PA"/wheel/*.whl "$PA/unpacked"
    bin="$(find "$PA/unpacked" -type f -name perf_analyzer | head -1)"
    [[ -n "$bin" ]] || { echo "setup: no perf_analyzer binary in the wheel" >&2; exit 1; }
    chmod +x "$bin"
    ln -sf "$bin" "$PA/perf_analyzer"
    touch "$PA/.installed"
fi

# Debian 13's C and C++ runtime, unpacked into a private folder through a private apt state (the system's
# apt configuration, lists and packages are left alone).
DEB="$CACHE/debian13"
if want perf_analyzer && [[ ! -f "$DEB/.installed" ]]; then
    echo "setup: Debian 13 runtime libraries for perf_analyzer"
    APT="$CACHE/apt"
    rm -rf "$APT" "$DEB"
    mkdir -p "$APT/state/lists/partial" "$APT/cache/archives/partial" "$APT/debs" "$DEB"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
        > "$APT/sources.list"
    apt_opts=(-o "Dir::State=$APT/state" -o "Dir::Cache=$APT/cache" -o "Dir::Etc::SourceList=$APT/sources.list"
              -o "Dir::Etc::SourceParts=/dev/null" -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root")
    timeout 600 apt-get "${apt_opts[@]}" -qq update
    (cd "$APT/debs" && timeout 600 apt-get "${apt_opts[@]}" -qq download libc6 libstdc++6 libgcc-s1 libssl3t64 zlib1g)
    for deb in "$APT"/debs/*.deb; do dpkg-deb -x "$deb" "$DEB"; done
    rm -rf "$APT/state" "$APT/cache"
    [[ -x "$DEB/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" ]] || { echo "setup: no ld-linux in $DEB" >&2; exit 1; }
    touch "$DEB/.installed"
fi
echo "setup: done ($CACHE)"
