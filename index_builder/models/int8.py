"""The cross-encoder's int8 copy, made on first use where it pays (``[cross_encoder] precision``).

ONNX Runtime's dynamic int8 quantisation (s8 weights, u8 activations quantised per call) runs the shared
cross-encoder at 0.55-0.61x its fp32 cost on a CPU with an int8 dot-product extension (AVX-512 VNNI, AVX-VNNI, AMX)
and loses 0.002-0.007 nDCG@10 (docs/results/interactive-cascade.md). Without one, ONNX Runtime's int8 kernels are
slower than its fp32 ones, and on a GPU provider the dynamic-quantisation operators fall back to the CPU. So
``precision = "auto"`` (the default) serves int8 exactly on the CPU provider of a CPU with such an extension, and the
model as it is everywhere else, saying why in one log line.

Where the copy comes from, in order: a copy shipped beside the model (:data:`SHIPPED_INT8`); one made earlier, in
the cache (``[cross_encoder] cache_dir``/int8 when set, else ``~/.cache/hybridrag/int8``) or, when that was not
writable, in the model's folder; the model itself when it is int8 (or fp16) already, e.g. a folder written by
``hybridrag models quantize``; else it is made (0.7-0.8 s for MiniLM-L6 on 2 cores) and written atomically (a
temporary file, then ``os.replace``), so that processes starting together never load half a file. A copy is named
by the sha256 of the fp32 model (``model.<16 hex>.int8.onnx``): a changed model is quantised again and never meets
a stale copy. Model folders are not the first choice: they are often shared (read-only, or another user's) or a
Hugging Face snapshot. Any failure to make the copy (no ``onnx`` package, no writable folder) keeps fp32 with a
warning: the service never fails to start over it.

One property fp32 has and the copy lacks: a pair's logit does not depend on the other pairs of its batch. Dynamic
quantisation puts each batch's activations on one scale, so with cross-request batching a pair's logit moves with
its batch-mates (up to 0.7 on SciFact pairs scored alone against in fives; the first passage of each query held:
tests/index_builder/test_int8.py). ``precision = "fp32"`` where answers must not depend on concurrent traffic.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

from index_builder.settings import CPU

log = logging.getLogger(__name__)

INT8_DOT_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni")  # /proc/cpuinfo names, best first
# int8 files a model folder may ship (this project's, Hugging Face optimum's and sentence-transformers' names)
SHIPPED_INT8 = ("model.int8.onnx", "model_quantized.onnx", "onnx/model_quantized.onnx",
                "onnx/model_qint8_avx512_vnni.onnx")
QUANTIZED_OPS = frozenset({"MatMulInteger", "DynamicQuantizeLinear", "QLinearMatMul", "DynamicQuantizeMatMul",
                           "MatMulIntegerToFloat", "QAttention", "ConvInteger", "QLinearConv"})


def int8_dot_extension(flags: Iterable[str]) -> str:
    """The best int8 dot-product extension among a CPU's feature flags, "" when it has none.

    >>> int8_dot_extension("fpu sse2 avx2 avx512f avx512_vnni avx_vnni".split())
    'avx512_vnni'
    >>> int8_dot_extension(["avx2", "fma", "amx_int8", "avx512_vnni"])
    'amx_int8'
    >>> int8_dot_extension(["sse2", "avx2", "fma"])
    ''
    """
    have = set(flags)
    return next((f for f in INT8_DOT_FLAGS if f in have), "")


def cpuinfo_flags(cpuinfo: str) -> list[str]:
    """The first ``flags`` line of a /proc/cpuinfo text (x86 Linux), split; [] when there is none.

    >>> cpuinfo_flags("processor\\t: 0\\nflags\\t\\t: fpu avx2 avx512_vnni\\nbugs\\t\\t: spectre_v1\\n")
    ['fpu', 'avx2', 'avx512_vnni']
    >>> cpuinfo_flags("Features\\t: fp asimd")
    []
    """
    return next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines()
                 if line.startswith("flags") and ":" in line), [])


def cpu_int8_dot(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """This CPU's int8 dot-product extension ("amx_int8", "avx512_vnni", "avx_vnni"), or "" (none, or no
    /proc/cpuinfo: not Linux)."""
    try:
        return int8_dot_extension(cpuinfo_flags(cpuinfo.read_text()))
    except OSError:
        return ""


def onnx_precision(onnx_path: Path) -> str:
    """What a model file computes in: "int8" (a quantised operator), "fp16" (a float16 weight) or "fp32".
    External weight files are not read."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    if any(node.op_type in QUANTIZED_OPS for node in graph.node):
        return "int8"
    return "fp16" if any(t.data_type == onnx.TensorProto.FLOAT16 for t in graph.initializer) else "fp32"


def is_quantized(onnx_path: Path) -> bool:
    return onnx_precision(onnx_path) == "int8"


def default_cache(cache_dir: str = "") -> Path:
    """Where int8 copies are kept: ``cache_dir``/int8 when configured, else ~/.cache/hybridrag/int8."""
    return Path(cache_dir).expanduser() / "int8" if cache_dir else Path.home() / ".cache" / "hybridrag" / "int8"


def quantize_atomic(src: Path, dest: Path) -> float:
    """Write ``src``'s dynamic int8 copy (s8 weights) to ``dest`` through a temporary file beside it and
    ``os.replace``; the seconds it took."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.stem}.", suffix=".onnx.tmp", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    t = time.perf_counter()
    quiet = _QuantizerChatter()
    logging.getLogger().addFilter(quiet)  # it logs a line per tensor on the root logger
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantize_dynamic(str(src), str(tmp), weight_type=QuantType.QInt8)
        os.replace(tmp, dest)
    finally:
        logging.getLogger().removeFilter(quiet)
        tmp.unlink(missing_ok=True)
    return time.perf_counter() - t


class _QuantizerChatter(logging.Filter):
    """Drops the quantiser's own records below ERROR (its per-tensor notes and pre-processing advice)."""

    def filter(self, record: logging.LogRecord) -> bool:
        path = record.pathname.replace(os.sep, "/")
        return record.levelno >= logging.ERROR or "onnxruntime/quantization" not in path


def _writable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK)


def serving_onnx(onnx_path: Path, sha256: Callable[[], str], *, precision: str, providers: Iterable[str],
                 cache_dir: str = "", cpu_ext: str | None = None) -> tuple[Path, str]:
    """The ONNX file to serve for a cross-encoder whose configured file is ``onnx_path`` (``sha256()``: its
    content hash, asked for only when a copy is looked up), and its precision: "int8", or "fp32" for the model
    as it is (a model that is int8 or fp16 already is served as it is and reads so, unless precision is "fp32"),
    by the module's rule.
    ``providers``: the session's providers in order (the first is the one it runs on); ``cpu_ext``: the CPU's
    int8 extension (None reads /proc/cpuinfo)."""
    if precision == "fp32":
        return onnx_path, "fp32"
    ext = cpu_int8_dot() if cpu_ext is None else cpu_ext
    first = next(iter(providers), CPU)
    if precision == "auto":
        if first != CPU:
            log.info("cross-encoder: fp32 kept, it runs on %s (precision auto makes int8 copies for CPUs only)", first)
            return onnx_path, "fp32"
        if not ext:
            log.info("cross-encoder: fp32 kept, this CPU has no int8 dot-product instructions (AVX-512 VNNI, "
                     "AVX-VNNI or AMX), where int8 is slower than fp32 (precision = \"int8\" forces it)")
            return onnx_path, "fp32"
    elif not ext:
        log.warning("cross-encoder: precision int8 on a CPU without VNNI/AMX: expect it slower than fp32")
    for shipped_name in SHIPPED_INT8:
        shipped = onnx_path.parent / shipped_name
        if shipped.is_file() and shipped != onnx_path:
            log.info("cross-encoder: int8 (%s), the copy beside the model", shipped)
            return shipped, "int8"
    roots = [default_cache(cache_dir), onnx_path.parent]
    name = f"{onnx_path.stem}.{sha256()[:16]}.int8.onnx"
    for root in roots:
        if (root / name).is_file():
            log.info("cross-encoder: int8 (%s; %s)", root / name, ext or "no VNNI/AMX")
            return root / name, "int8"
    try:
        found = onnx_precision(onnx_path)
        if found != "fp32":  # an int8 model already, or an fp16 one (a GPU's copy): served as it is
            log.info("cross-encoder: %s (%s is %s already)", found, onnx_path, found)
            return onnx_path, found
    except Exception as e:  # noqa: BLE001  (no onnx package, an unreadable graph: serve the model as it is)
        log.warning("cross-encoder: fp32 kept, cannot read %s to quantise it (%s)", onnx_path, e)
        return onnx_path, "fp32"
    for root in roots:
        if not _writable(root):
            continue
        dest = root / name
        try:
            seconds = quantize_atomic(onnx_path, dest)
        except Exception as e:  # noqa: BLE001  (a full disk, a graph the quantiser refuses: fp32 still serves)
            log.warning("cross-encoder: making an int8 copy of %s in %s failed (%s)", onnx_path, root, e)
            continue
        log.info("cross-encoder: made its int8 copy %s in %.1f s (%s; once, then reused)", dest, seconds,
                 ext or "no VNNI/AMX")
        return dest, "int8"
    log.warning("cross-encoder: fp32 kept, no writable folder for its int8 copy (%s)", ", ".join(map(str, roots)))
    return onnx_path, "fp32"
