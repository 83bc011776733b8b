#!/usr/bin/env bash
# Generate the gRPC/protobuf Python stubs from proto/ into retrieval/api/ (the one way stubs are made).
# --check: generate into a temporary folder and fail if the committed stubs differ (CI runs this).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
out=retrieval/api
check=0
[ "${1:-}" = "--check" ] && check=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m grpc_tools.protoc -Iproto --python_out="$tmp" --grpc_python_out="$tmp" --pyi_out="$tmp" \
  proto/hybridrag/v1/retriever.proto
mkdir -p "$tmp/final"
for f in retriever_pb2.py retriever_pb2.pyi retriever_pb2_grpc.py; do
  # the generated code imports hybridrag.v1.*; our package is retrieval.api
  sed 's/^from hybridrag\.v1 import retriever_pb2/from retrieval.api import retriever_pb2/' \
    "$tmp/hybridrag/v1/$f" > "$tmp/final/$f"
done
if [ $check = 1 ]; then
  for f in retriever_pb2.py retriever_pb2.pyi retriever_pb2_grpc.py; do
    if ! cmp -s "$tmp/final/$f" "$out/$f"; then
      echo "gen_proto: $out/$f is out of date with proto/: run bash scripts/gen_proto.sh" >&2
      exit 1
    fi
  done
  echo "gen_proto: stubs are current"
else
  mkdir -p "$out"
  cp "$tmp/final/"* "$out/"
  [ -f "$out/__init__.py" ] || printf '"""Generated gRPC stubs (scripts/gen_proto.sh); do not edit."""\n' > "$out/__init__.py"
  echo "gen_proto: wrote $out"
fi
