"""The core calls of the modules' training step (te.Linear, LayerNormLinear, LayerNormMLP),
without the argument checks of the public helpers in cast.py, gemm.py and bias_grad.py.

The modules make every argument themselves: contiguous 2-D float activations on the
parameters' device, FP8 buffers just allocated, the scale and amax slots of their own
recipe state (passed as addresses, so no [1]-element views are made). The core still
validates every descriptor it gets (dtypes, shapes, devices, null pointers), so a mistake
here raises the core's error instead of touching wrong memory; float operands are
checked for contiguity, since descriptors carry no strides.

Why a second path: host time shows at small sizes (input [16, 64]), and there the public
helpers' checks, descriptor building, [1]-element scale views and torch.Size-shaped
allocations were most of an FP8 te.Linear step's host work: about 4x PyTorch's
nn.Linear on the CPU before this path, 1.7x with it (benchmarks/bench_host_overhead.py).
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Tuple

import torch

from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions.tensor_desc import DType, current_stream, te_dtype

# A module import, not a name: the tensor package imports the cast helpers of this
# package, so either package may be the one imported first.
import transformer_engine.pytorch.tensor._internal.float8_tensor_base as _f8

__all__ = [
    "CPU", "CUDA", "CoreDevice", "Fp8Output", "core_device", "core_device_at", "cuda_workspace",
    "quantize", "quantize_current_scaling", "QuantizeGroup", "dbias_quantize", "gemm", "gemm_fp8_output",
    "gemm_bias_grad", "delayed_scaling_update", "dbias_quantize_current_scaling", "workspace_and_cast_slots",
    "norm_forward", "norm_backward", "activation_forward", "activation_backward", "dact_dbias_quantize",
]

CPU = int(_core.DeviceType.CPU)  # CoreDevice.type values
CUDA = int(_core.DeviceType.CUDA)
_PER_TENSOR = int(_core.ScalingMode.PER_TENSOR)
_EPILOGUE_NONE = int(_core.GemmEpilogue.NONE)
_EPILOGUE_BIAS = int(_core.GemmEpilogue.BIAS)
_EPILOGUE_BGRAD = int(_core.GemmEpilogue.BGRAD)
_U8 = torch.uint8
_F32 = torch.float32


class CoreDevice(NamedTuple):
    """Where one forward's (or backward's) core calls run: the core's device type and
    index, torch's current stream there (read once: nothing in between can change it),
    and cuBLASLt's workspace (address and bytes; 0 on the CPU)."""

    type: int
    index: int
    stream: int
    workspace: int
    workspace_size: int


_CPU_DEVICE = CoreDevice(CPU, 0, 0, 0, 0)
# device index -> (workspace tensor, its address, its bytes), kept for the process.
_CUDA_WORKSPACES: Dict[int, Tuple[torch.Tensor, int, int]] = {}


def cuda_workspace(index: int) -> Tuple[torch.Tensor, int, int]:
    """cuBLASLt's scratch on CUDA device ``index`` (allocated once): (tensor, address, bytes)."""
    entry = _CUDA_WORKSPACES.get(index)
    if entry is None:
        ws = torch.empty(_core.gemm_workspace_size(), dtype=_U8, device=torch.device("cuda", index))
        entry = _CUDA_WORKSPACES[index] = (ws, ws.data_ptr(), ws.numel())
    return entry


def core_device(t: torch.Tensor) -> CoreDevice:
    """The CoreDevice of tensor ``t`` (a CPU or CUDA tensor)."""
    if t.is_cuda:
        index = t.get_device()
        _, ws, ws_size = cuda_workspace(index)
        return CoreDevice(CUDA, index, current_stream(index), ws, ws_size)
    if t.is_cpu:
        return _CPU_DEVICE
    raise ValueError(f"OpenTE modules run on CPU or CUDA tensors, got a tensor on {t.device}")


def core_device_at(device: torch.device) -> CoreDevice:
    """The CoreDevice of ``device`` as of now (torch's current stream there), for work
    that runs later than the tensors it reads were made (delay_wgrad_compute)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        _, ws, ws_size = cuda_workspace(index)
        return CoreDevice(CUDA, index, current_stream(index), ws, ws_size)
    if device.type == "cpu":
        return _CPU_DEVICE
    raise ValueError(f"OpenTE modules run on CPU or CUDA tensors, got a tensor on {device}")


_CORE_DTYPES = {torch.float32: int(DType.kFloat32), torch.float16: int(DType.kFloat16),
                torch.bfloat16: int(DType.kBFloat16)}


def _float_desc(t: torch.Tensor, dev: CoreDevice, name: str, amax: int = 0) -> _core.Tensor:
    """``t``'s descriptor; ``amax``: the address of an fp32 the op raises to max|t| as it
    writes t (0: none)."""
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous() first)")
    dtype = _CORE_DTYPES.get(t.dtype)
    if dtype is None:
        dtype = int(te_dtype(t.dtype, name))  # the core then names what it expected
    if amax:
        return _core.Tensor(dev.type, dev.index, dtype, t.shape, t.data_ptr(), 0, 0, 0, amax)
    return _core.Tensor(dev.type, dev.index, dtype, t.shape, t.data_ptr())


def _address(t: Optional[torch.Tensor]) -> int:
    return t.data_ptr() if t is not None else 0


def _fp8_buffers(rows: int, cols: int, device: torch.device, rowwise: bool, columnwise: bool):
    """Uninitialized (data [rows, cols], data_t [cols, rows], scale_inv [1]). Sizes as
    separate ints: torch.empty parses them several times faster than a torch.Size."""
    data = torch.empty(rows, cols, dtype=_U8, device=device) if rowwise else None
    data_t = torch.empty(cols, rows, dtype=_U8, device=device) if columnwise else None
    return data, data_t, torch.empty(1, dtype=_F32, device=device)


def _fp8_desc(rows: int, cols: int, fp8_dtype: DType, data, data_t, scale: int, scale_inv: torch.Tensor, amax: int,
              dev: CoreDevice) -> _core.Tensor:
    return _core.Tensor(dev.type, dev.index, int(fp8_dtype), (rows, cols), _address(data), _address(data_t),
                        scale, scale_inv.data_ptr(), amax, _PER_TENSOR)


# (device index, stream) -> the op workspace kept for that stream (the largest asked for).
_STREAM_SCRATCH: Dict[Tuple[int, int], torch.Tensor] = {}


def _scratch(size: int, dev: CoreDevice, device: torch.device) -> Tuple[Optional[torch.Tensor], int]:
    """A workspace of ``size`` bytes for one op (None and 0 when the op needs none, as on
    the CPU). Ops use their workspace only while they run, and the ops of one stream run
    one after another, so each stream keeps one buffer for all of them instead of an
    allocation per op. Not while a CUDA graph is captured (a graph may be replayed on
    another stream): then a fresh allocation from the graph's pool, which the caller keeps
    referenced until the op is queued."""
    if not size:
        return None, 0
    if torch.cuda.is_current_stream_capturing():
        ws = torch.empty(size, dtype=_U8, device=device)
        return ws, ws.data_ptr()
    key = (dev.index, dev.stream)
    ws = _STREAM_SCRATCH.get(key)
    if ws is None or ws.numel() < size:
        # Allocated on this stream: the caching allocator orders a reuse of the old one after it.
        ws = _STREAM_SCRATCH[key] = torch.empty(size, dtype=_U8, device=device)
    return ws, ws.data_ptr()


class Fp8Output(NamedTuple):
    """Where an op that writes FP8 puts it: format, the addresses of the scale it casts with
    and of the amax it raises (0: none), and whether the column-wise copy is made too."""

    fp8_dtype: DType
    scale: int
    amax: int
    columnwise: bool


def _output(rows: int, cols: int, like: torch.Tensor, fp8: Optional[Fp8Output], dev: CoreDevice):
    """(result, descriptor) of an op's [rows, cols] output: like's dtype, or FP8 storage."""
    if fp8 is None:
        out = torch.empty(rows, cols, dtype=like.dtype, device=like.device)
        return out, _float_desc(out, dev, "out")
    data, data_t, scale_inv = _fp8_buffers(rows, cols, like.device, True, fp8.columnwise)
    desc = _fp8_desc(rows, cols, fp8.fp8_dtype, data, data_t, fp8.scale, scale_inv, fp8.amax, dev)
    return _f8.Float8TensorBase.wrap(data, data_t, scale_inv, fp8.fp8_dtype), desc


def quantize(x: torch.Tensor, fp8_dtype: DType, scale: int, amax: int, rowwise: bool, columnwise: bool,
             dev: CoreDevice) -> _f8.Float8TensorBase:
    """``x`` (2-D float) cast to FP8 with the fp32 scale at address ``scale``, raising the
    fp32 at ``amax`` (0: none) to max|x| in the same pass, as quantize() does."""
    rows, cols = x.shape
    data, data_t, scale_inv = _fp8_buffers(rows, cols, x.device, rowwise, columnwise)
    out = _fp8_desc(rows, cols, fp8_dtype, data, data_t, scale, scale_inv, amax, dev)
    _core.quantize(_float_desc(x, dev, "x"), out, dev.stream)
    return _f8.Float8TensorBase.wrap(data, data_t, scale_inv, fp8_dtype)


def quantize_current_scaling(x: torch.Tensor, fp8_dtype: DType, epsilon: float, force_pow_2_scales: bool,
                             rowwise: bool, columnwise: bool, dev: CoreDevice) -> _f8.Float8TensorBase:
    """``x`` (2-D float) cast to FP8 with current scaling: amax of x, then the scale from it,
    then the cast, all queued by one core call (te_quantize_current_scaling)."""
    rows, cols = x.shape
    device = x.device
    data, data_t, scale_inv = _fp8_buffers(rows, cols, device, rowwise, columnwise)
    keep, amax = _amax_and_scale_slots(1, dev, device)  # kept referenced until the op is queued
    out = _fp8_desc(rows, cols, fp8_dtype, data, data_t, amax + 4, scale_inv, amax, dev)
    _core.quantize_current_scaling(_float_desc(x, dev, "x"), out, float(epsilon), bool(force_pow_2_scales),
                                   dev.stream)
    return _f8.Float8TensorBase.wrap(data, data_t, scale_inv, fp8_dtype)


# Past this many elements a current-scaling cast of an activation (or its gradient) takes
# the amax its producer computed as it wrote it (FusedAmax) instead of a pass of its own;
# up to it one block does amax, scale and cast in one launch (the core's small cast).
FUSED_AMAX_MIN_ELEMENTS = 16384


class FusedAmax:
    """An fp32 amax, zeroed, that an op raises as it writes a float tensor (its ``address``
    goes to activation_forward / activation_backward), then the current-scaling cast of
    that tensor from it (``quantize`` / ``dbias_quantize``): Transformer Engine's
    quantize_with_amax, one read of the tensor fewer than quantize_current_scaling. The
    slot after the amax holds the scale computed from it."""

    def __init__(self, device: torch.device):
        self.buffer = torch.zeros(2, dtype=_F32, device=device)
        self.address = self.buffer.data_ptr()

    def _scale(self, fp8_dtype: DType, epsilon: float, force_pow_2_scales: bool, scale_inv: torch.Tensor,
               dev: CoreDevice) -> int:
        scale = self.address + 4
        _core.compute_scale_from_amax(self.address, scale, scale_inv.data_ptr(), int(fp8_dtype), float(epsilon),
                                      bool(force_pow_2_scales), dev.type, dev.index, dev.stream)
        return scale

    def quantize(self, x: torch.Tensor, fp8_dtype: DType, epsilon: float, force_pow_2_scales: bool, rowwise: bool,
                 columnwise: bool, dev: CoreDevice) -> _f8.Float8TensorBase:
        """As quantize_current_scaling(x, ...), x's amax being this one's."""
        rows, cols = x.shape
        data, data_t, scale_inv = _fp8_buffers(rows, cols, x.device, rowwise, columnwise)
        scale = self._scale(fp8_dtype, epsilon, force_pow_2_scales, scale_inv, dev)
        _core.quantize(_float_desc(x, dev, "x"), _fp8_desc(rows, cols, fp8_dtype, data, data_t, scale, scale_inv, 0,
                                                           dev), dev.stream)
        return _f8.Float8TensorBase.wrap(data, data_t, scale_inv, fp8_dtype)

    def dbias_quantize(self, dy: torch.Tensor, fp8_dtype: DType, epsilon: float, force_pow_2_scales: bool,
                       rowwise: bool, columnwise: bool, dev: CoreDevice, dbias_dtype: Optional[torch.dtype] = None
                       ) -> Tuple[torch.Tensor, _f8.Float8TensorBase]:
        """As dbias_quantize_current_scaling(dy, ...), dy's amax being this one's."""
        rows, cols = dy.shape
        data, data_t, scale_inv = _fp8_buffers(rows, cols, dy.device, rowwise, columnwise)
        scale = self._scale(fp8_dtype, epsilon, force_pow_2_scales, scale_inv, dev)
        dbias = torch.empty(cols, dtype=dbias_dtype_for(dy, dbias_dtype), device=dy.device)
        ws_size = _core.dbias_workspace_size(rows, cols, dev.type, dev.index)
        ws, ws_ptr = _scratch(ws_size, dev, dy.device)
        _core.dbias_cast_transpose(_float_desc(dy, dev, "grad"),
                                   _fp8_desc(rows, cols, fp8_dtype, data, data_t, scale, scale_inv, 0, dev),
                                   _float_desc(dbias, dev, "dbias"), ws_ptr, ws_size, dev.stream)
        return dbias, _f8.Float8TensorBase.wrap(data, data_t, scale_inv, fp8_dtype)


def _amax_and_scale_slots(count: int, dev: CoreDevice, device: torch.device) -> Tuple[torch.Tensor, int]:
    """Where ``count`` current-scaling casts put their amax and scale (8 bytes each, amax
    first): (the buffer, its address). A cast writes both before reading them and nothing
    reads them after, so on the GPU the stream's scratch (_scratch) holds them, without
    an allocation a cast; on the CPU a small tensor."""
    if dev.type == CUDA:
        return _scratch(8 * count, dev, device)
    t = torch.empty(2 * count, dtype=_F32)
    return t, t.data_ptr()


def workspace_and_cast_slots(ws_size: int, dev: CoreDevice,
                             device: torch.device) -> Tuple[Optional[torch.Tensor], int, int]:
    """(what to keep referenced until the op is queued, the workspace's address, the
    amax's address) of an op with a ``ws_size``-byte workspace that also makes one
    current-scaling cast (its amax, then its scale: 8 bytes). On the GPU both in the
    stream's scratch, the slots after the workspace (16-byte aligned); on the CPU, which
    needs no workspace (address 0), the slots in a small tensor."""
    if dev.type == CUDA:
        ws_bytes = (ws_size + 15) // 16 * 16
        keep, ws_ptr = _scratch(ws_bytes + 8, dev, device)
        return keep, ws_ptr, ws_ptr + ws_bytes
    keep, amax = _amax_and_scale_slots(1, dev, device)
    return keep, 0, amax


class QuantizeGroup:
    """FP8 casts made by one core call: ``add`` / ``add_current_scaling`` return a cast's
    FP8 storage at once (its buffers exist, not yet written) and ``run`` queues what
    writes them, before anything can read them; ``add_conversion`` likewise for a plain
    dtype conversion. On the GPU the small jobs of a group are one kernel launch
    (te_multi_quantize), whatever their dtypes: a small layer's input, weight and bias,
    where a launch costs more host time than the kernel takes on the device."""

    __slots__ = ("dev", "_sources", "_inputs", "_outputs", "_current", "_conversions")

    def __init__(self, dev: CoreDevice):
        self.dev = dev
        # Casts with a given scale (delayed scaling) and conversions: the input tensors
        # themselves are held until run(), as their descriptors hold only addresses (an
        # input made for the step, such as a bias converted to the autocast dtype, would
        # otherwise be freed, and its memory reused, before the launch reads it).
        self._sources, self._inputs, self._outputs = [], [], []
        # (epsilon, force_pow_2_scales) -> [(x, rows, cols, fp8_dtype, data, data_t, scale_inv)]
        self._current: Dict[Tuple[float, bool], list] = {}
        self._conversions: List[Tuple[_core.Tensor, _core.Tensor]] = []  # (input, output) descriptors

    def add(self, x: torch.Tensor, fp8_dtype: DType, scale: int, amax: int, rowwise: bool,
            columnwise: bool) -> _f8.Float8TensorBase:
        """As quantize(), run by ``run``."""
        rows, cols = x.shape
        data, data_t, scale_inv = _fp8_buffers(rows, cols, x.device, rowwise, columnwise)
        self._sources.append(x)
        self._inputs.append(_float_desc(x, self.dev, "x"))
        self._outputs.append(_fp8_desc(rows, cols, fp8_dtype, data, data_t, scale, scale_inv, amax, self.dev))
        return _f8.Float8TensorBase.wrap(data, data_t, scale_inv, fp8_dtype)

    def add_current_scaling(self, x: torch.Tensor, fp8_dtype: DType, epsilon: float, force_pow_2_scales: bool,
                            rowwise: bool, columnwise: bool) -> _f8.Float8TensorBase:
        """As quantize_current_scaling(), run by ``run``."""
        rows, cols = x.shape
        data, data_t, scale_inv = _fp8_buffers(rows, cols, x.device, rowwise, columnwise)
        key = (float(epsilon), bool(force_pow_2_scales))
        self._current.setdefault(key, []).append((x, rows, cols, fp8_dtype, data, data_t, scale_inv))
        return _f8.Float8TensorBase.wrap(data, data_t, scale_inv, fp8_dtype)

    def add_conversion(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``x`` converted to the float ``dtype`` (a new tensor, written by ``run``): the
        bias an FP8 GEMM reads in bf16, converted in the casts' launch rather than one
        of its own."""
        out = torch.empty(x.shape, dtype=dtype, device=x.device)
        self._sources.append(x)
        self._conversions.append((_float_desc(x, self.dev, "x"), _float_desc(out, self.dev, "out")))
        return out

    def run(self) -> None:
        """Queues the casts added: one core call for those with a given scale, one for
        each (epsilon, force_pow_2_scales) of the current-scaling ones. The conversions
        join the first of those calls (a core call takes them next to either kind)."""
        dev = self.dev
        conversions = self._conversions
        if self._inputs or (conversions and not self._current):
            inputs, outputs = self._inputs, self._outputs
            if conversions:
                inputs, outputs = inputs + [c[0] for c in conversions], outputs + [c[1] for c in conversions]
                conversions = []
            _core.multi_quantize(inputs, outputs, dev.stream)
        for (epsilon, pow_2), casts in self._current.items():
            keep, base = _amax_and_scale_slots(len(casts), dev, casts[0][0].device)  # kept until queued
            inputs, outputs = [c[0] for c in conversions], [c[1] for c in conversions]
            conversions = []
            for i, (x, rows, cols, fp8_dtype, data, data_t, scale_inv) in enumerate(casts):
                amax = base + 8 * i
                inputs.append(_float_desc(x, dev, "x"))
                outputs.append(_fp8_desc(rows, cols, fp8_dtype, data, data_t, amax + 4, scale_inv, amax, dev))
            _core.multi_quantize_current_scaling(inputs, outputs, epsilon, pow_2, dev.stream)


def dbias_dtype_for(grad: torch.Tensor, wanted: Optional[torch.dtype]) -> torch.dtype:
    """The dtype a bias-gradient cast writes dbias in: float32 when that is the dtype
    wanted (an fp32 bias with bf16 gradients, as under torch.autocast: the core writes
    its fp32 sums unrounded, no conversion after), else the gradient's."""
    return torch.float32 if wanted == torch.float32 else grad.dtype


def dbias_quantize(dy: torch.Tensor, fp8_dtype: DType, scale: int, amax: int, rowwise: bool, columnwise: bool,
                   dev: CoreDevice, dbias_dtype: Optional[torch.dtype] = None
                   ) -> Tuple[torch.Tensor, _f8.Float8TensorBase]:
    """(dbias, dy in FP8) of a 2-D gradient in one pass, as bgrad_quantize(); dbias in
    dbias_dtype_for(dy, dbias_dtype)."""
    rows, cols = dy.shape
    device = dy.device
    data, data_t, scale_inv = _fp8_buffers(rows, cols, device, rowwise, columnwise)
    dbias = torch.empty(cols, dtype=dbias_dtype_for(dy, dbias_dtype), device=device)
    ws_size = _core.dbias_workspace_size(rows, cols, dev.type, dev.index)
    ws, ws_ptr = _scratch(ws_size, dev, device)
    _core.dbias_cast_transpose(_float_desc(dy, dev, "grad"),
                               _fp8_desc(rows, cols, fp8_dtype, data, data_t, scale, scale_inv, amax, dev),
                               _float_desc(dbias, dev, "dbias"), ws_ptr, ws_size, dev.stream)
    return dbias, _f8.Float8TensorBase.wrap(data, data_t, scale_inv, fp8_dtype)


def dbias_quantize_current_scaling(dy: torch.Tensor, fp8_dtype: DType, epsilon: float, force_pow_2_scales: bool,
                                   rowwise: bool, columnwise: bool, dev: CoreDevice,
                                   dbias_dtype: Optional[torch.dtype] = None
                                   ) -> Tuple[torch.Tensor, _f8.Float8TensorBase]:
    """(dbias, dy in FP8) of a 2-D gradient under current scaling, queued by one core call
    (te_dbias_cast_transpose_current_scaling; one launch for a small dy); dbias in
    dbias_dtype_for(dy, dbias_dtype)."""
    rows, cols = dy.shape
    device = dy.device
    data, data_t, scale_inv = _fp8_buffers(rows, cols, device, rowwise, columnwise)
    dbias = torch.empty(cols, dtype=dbias_dtype_for(dy, dbias_dtype), device=device)
    ws_size = _core.dbias_workspace_size(rows, cols, dev.type, dev.index)
    keep, ws_ptr, amax = workspace_and_cast_slots(ws_size, dev, device)
    _core.dbias_cast_transpose_current_scaling(
        _float_desc(dy, dev, "grad"), _fp8_desc(rows, cols, fp8_dtype, data, data_t, amax + 4, scale_inv, amax, dev),
        _float_desc(dbias, dev, "dbias"), float(epsilon), bool(force_pow_2_scales), ws_ptr, ws_size, dev.stream)
    return dbias, _f8.Float8TensorBase.wrap(data, data_t, scale_inv, fp8_dtype)


class _GemmDesc:
    """An FP8 storage's GEMM descriptor with what it was built from. Copies of the storage
    (copy.deepcopy of a module holding FP8 weights, pickling) get an empty one: the
    descriptor holds addresses and cannot be copied."""

    __slots__ = ("key", "desc", "rows", "cols")

    def __init__(self, key=None, desc=None, rows=0, cols=0):
        self.key, self.desc, self.rows, self.cols = key, desc, rows, cols

    def __reduce__(self):
        return _GemmDesc, ()


def _gemm_operand(t, dev: CoreDevice, name: str) -> Tuple[_core.Tensor, int, int]:
    """(descriptor, rows, cols) of a 2-D GEMM operand: a float tensor or FP8 storage (both
    layouts passed; the core reads the one its layout needs)."""
    if isinstance(t, _f8.Float8TensorBase):
        data, data_t, scale_inv, fp8_dtype = t._data, t._transpose, t._scale_inv, t._fp8_dtype
        # Each FP8 operand of a training step feeds two GEMMs (x: fprop and wgrad, W: fprop
        # and dgrad, dy: dgrad and wgrad): the first builds the descriptor, the second
        # reuses it while the storage holds the same tensors (held, so none can be freed
        # and another take its id). Only for the plain storage the modules' casts make: a
        # Float8Tensor parameter's buffers may be re-pointed in place (FSDP resizes
        # parameter storage), which an identity check cannot see.
        plain = type(t) is _f8.Float8TensorBase
        cached = t.__dict__.get("_gemm_desc") if plain else None
        if cached is not None:
            key = cached.key
            if (key is not None and key[0] is data and key[1] is data_t and key[2] is scale_inv
                    and key[3] == fp8_dtype and key[4] == dev.index and key[5] == dev.type):
                return cached.desc, cached.rows, cached.cols
        if data is not None:
            rows, cols = data.shape
        else:
            cols, rows = data_t.shape
        desc = _core.Tensor(dev.type, dev.index, int(fp8_dtype), (rows, cols), _address(data), _address(data_t),
                            0, scale_inv.data_ptr(), 0, _PER_TENSOR)
        if plain:
            t._gemm_desc = _GemmDesc((data, data_t, scale_inv, fp8_dtype, dev.index, dev.type), desc, rows, cols)
        return desc, rows, cols
    rows, cols = t.shape
    return _float_desc(t, dev, name), rows, cols


def gemm(A, B, dev: CoreDevice, out_dtype: torch.dtype, transa: bool, transb: bool, *,
         bias: Optional[torch.Tensor] = None, split_accumulator: bool = False) -> torch.Tensor:
    """``op_B(B) @ op_A(A) (+ bias)`` as a new [m, n] tensor of ``out_dtype`` (general_gemm's
    convention: A, B 2-D, both float of one dtype or both Float8TensorBase)."""
    a_desc, a_rows, a_cols = _gemm_operand(A, dev, "A")
    b_desc, b_rows, b_cols = _gemm_operand(B, dev, "B")
    n = a_rows if transa else a_cols
    m = b_cols if transb else b_rows
    out = torch.empty(m, n, dtype=out_dtype, device=B.device)
    bias_desc = _float_desc(bias, dev, "bias") if bias is not None else None
    _core.gemm(a_desc, b_desc, _float_desc(out, dev, "out"), bias_desc, None, None, transa, transb,
               _EPILOGUE_BIAS if bias is not None else _EPILOGUE_NONE, 1.0, 0.0, bool(split_accumulator),
               dev.workspace, dev.workspace_size, dev.stream)
    return out


def gemm_fp8_output(A, B, dev: CoreDevice, transa: bool, transb: bool, fp8_dtype: DType, scale: torch.Tensor,
                    amax: torch.Tensor, *, bias: Optional[torch.Tensor] = None,
                    split_accumulator: bool = False) -> _f8.Float8TensorBase:
    """``op_B(B) @ op_A(A) (+ bias)`` (FP8 operands) written by the GEMM itself as a new
    row-wise [m, n] FP8 tensor, cast with ``scale`` (float32 [1]) and raising ``amax``
    (float32 [1]) to max(amax, max|result|), as a cast would. The GEMM overwrites the amax
    it is given, so it gets a scratch one that is folded into ``amax`` afterwards."""
    a_desc, a_rows, a_cols = _gemm_operand(A, dev, "A")
    b_desc, b_rows, b_cols = _gemm_operand(B, dev, "B")
    n = a_rows if transa else a_cols
    m = b_cols if transb else b_rows
    device = B.device
    data = torch.empty(m, n, dtype=_U8, device=device)
    gemm_amax = torch.empty(1, dtype=_F32, device=device)
    scale_inv = torch.reciprocal(scale)  # the GEMM does not write it
    out = _core.Tensor(dev.type, dev.index, int(fp8_dtype), (m, n), data.data_ptr(), 0, scale.data_ptr(),
                       scale_inv.data_ptr(), gemm_amax.data_ptr(), _PER_TENSOR)
    bias_desc = _float_desc(bias, dev, "bias") if bias is not None else None
    _core.gemm(a_desc, b_desc, out, bias_desc, None, None, transa, transb,
               _EPILOGUE_BIAS if bias is not None else _EPILOGUE_NONE, 1.0, 0.0, bool(split_accumulator),
               dev.workspace, dev.workspace_size, dev.stream)
    torch.maximum(amax, gemm_amax, out=amax)
    return _f8.Float8TensorBase.wrap(data, None, scale_inv, fp8_dtype)


def gemm_bias_grad(A: torch.Tensor, B: torch.Tensor, dev: CoreDevice, out_dtype: torch.dtype, transa: bool,
                   transb: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """(``op_B(B) @ op_A(A)``, the row sums of ``op_B(B)`` [m]), both ``out_dtype``, from one
    GEMM with cuBLASLt's bias-gradient epilogue: the wgrad GEMM ("NT", B the output
    gradient) and the bias gradient in one launch. Float operands only (CUDA)."""
    a_desc, a_rows, a_cols = _gemm_operand(A, dev, "A")
    b_desc, b_rows, b_cols = _gemm_operand(B, dev, "B")
    n = a_rows if transa else a_cols
    m = b_cols if transb else b_rows
    out = torch.empty(m, n, dtype=out_dtype, device=B.device)
    bias_grad = torch.empty(m, dtype=out_dtype, device=B.device)
    _core.gemm(a_desc, b_desc, _float_desc(out, dev, "out"), None, None, _float_desc(bias_grad, dev, "bias_grad"),
               transa, transb, _EPILOGUE_BGRAD, 1.0, 0.0, False, dev.workspace, dev.workspace_size, dev.stream)
    return out, bias_grad


def delayed_scaling_update(groups, margin: float, amax_compute_algo: int, dev: CoreDevice) -> None:
    """One te_delayed_scaling_update launch over ``groups`` (DelayedScalingState.core_group()
    tuples, all on ``dev``, each naming its FP8 format), as
    cpp_extensions.recipe.delayed_scaling_update."""
    _core.delayed_scaling_update(groups, amax_compute_algo, margin, dev.type, dev.index, dev.stream)


def norm_forward(layernorm: bool, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], eps: float,
                 zero_centered_gamma: bool, dev: CoreDevice, fp8: Optional[Fp8Output] = None, amax: int = 0):
    """(out, mu, rsigma) of LayerNorm (``layernorm``, mu None otherwise: RMSNorm) over the
    rows of the 2-D ``x``, as layernorm_fwd / rmsnorm_fwd: out in x's dtype, or FP8.
    ``amax`` (an output in x's dtype): the address of an fp32 raised to the output's
    max|y| (FusedAmax)."""
    rows, hidden = x.shape
    device = x.device
    x_desc = _float_desc(x, dev, "inp")
    if amax:
        out = torch.empty(rows, hidden, dtype=x.dtype, device=device)
        out_desc = _float_desc(out, dev, "out", amax)
    else:
        out, out_desc = _output(rows, hidden, x, fp8, dev)
    mu = torch.empty(rows, dtype=_F32, device=device) if layernorm else None
    rsigma = torch.empty(rows, dtype=_F32, device=device)
    ws_size = _core.norm_workspace_size(rows, hidden, dev.type, dev.index)
    ws, ws_ptr = _scratch(ws_size, dev, device)
    if layernorm:
        _core.layernorm_fwd(x_desc, _float_desc(weight, dev, "weight"), _float_desc(bias, dev, "bias"), float(eps),
                            bool(zero_centered_gamma), out_desc, _float_desc(mu, dev, "mu"),
                            _float_desc(rsigma, dev, "rsigma"), ws_ptr, ws_size, dev.stream)
    else:
        _core.rmsnorm_fwd(x_desc, _float_desc(weight, dev, "weight"), float(eps), bool(zero_centered_gamma), out_desc,
                          _float_desc(rsigma, dev, "rsigma"), ws_ptr, ws_size, dev.stream)
    return out, mu, rsigma


def norm_backward(layernorm: bool, dz: torch.Tensor, x: torch.Tensor, mu: Optional[torch.Tensor],
                  rsigma: torch.Tensor, gamma: torch.Tensor, zero_centered_gamma: bool, dev: CoreDevice):
    """(dx, dgamma, dbeta or None) of norm_forward, as layernorm_bwd / rmsnorm_bwd (2-D dz, x)."""
    rows, hidden = x.shape
    device = x.device
    dx = torch.empty(rows, hidden, dtype=x.dtype, device=device)
    dgamma = torch.empty(hidden, dtype=gamma.dtype, device=device)
    dbeta = torch.empty(hidden, dtype=gamma.dtype, device=device) if layernorm else None
    ws_size = _core.norm_workspace_size(rows, hidden, dev.type, dev.index)
    ws, ws_ptr = _scratch(ws_size, dev, device)
    dz_desc, x_desc = _float_desc(dz, dev, "dz"), _float_desc(x, dev, "x")
    rsigma_desc, gamma_desc = _float_desc(rsigma, dev, "rsigma"), _float_desc(gamma, dev, "gamma")
    dx_desc, dgamma_desc = _float_desc(dx, dev, "dx"), _float_desc(dgamma, dev, "dgamma")
    if layernorm:
        _core.layernorm_bwd(dz_desc, x_desc, _float_desc(mu, dev, "mu"), rsigma_desc, gamma_desc,
                            bool(zero_centered_gamma), dx_desc, dgamma_desc, _float_desc(dbeta, dev, "dbeta"), ws_ptr,
                            ws_size, dev.stream)
    else:
        _core.rmsnorm_bwd(dz_desc, x_desc, rsigma_desc, gamma_desc, bool(zero_centered_gamma), dx_desc, dgamma_desc,
                          ws_ptr, ws_size, dev.stream)
    return dx, dgamma, dbeta


def activation_forward(kind: int, gated: bool, x: torch.Tensor, dev: CoreDevice, fp8: Optional[Fp8Output] = None,
                       amax: int = 0):
    """The activation ``kind`` (an _core.Activation value) of the 2-D ``x``, as gelu() & co.:
    [rows, cols], or [rows, cols / 2] for the ``gated`` kinds, in x's dtype or FP8. ``amax``
    (a float output): the address of an fp32 raised to the output's max|y| (FusedAmax)."""
    rows, cols = x.shape
    if amax:
        out = torch.empty(rows, cols // 2 if gated else cols, dtype=x.dtype, device=x.device)
        out_desc = _float_desc(out, dev, "out", amax)
    else:
        out, out_desc = _output(rows, cols // 2 if gated else cols, x, fp8, dev)
    _core.activation_fwd(kind, _float_desc(x, dev, "inp"), out_desc, dev.stream)
    return out


def activation_backward(kind: int, grad: torch.Tensor, x: torch.Tensor, dev: CoreDevice,
                        amax: int = 0) -> torch.Tensor:
    """The gradient of activation_forward's input (2-D, x's dtype), as dgelu() & co.;
    ``amax`` as activation_forward's, raised to max|dx|."""
    rows, cols = x.shape
    dx = torch.empty(rows, cols, dtype=x.dtype, device=x.device)
    _core.activation_bwd(kind, _float_desc(grad, dev, "grad"), _float_desc(x, dev, "fwd_input"),
                         _float_desc(dx, dev, "dinput", amax), dev.stream)
    return dx


def dact_dbias_quantize(kind: int, grad: torch.Tensor, x: torch.Tensor, fp8: Fp8Output, with_dbias: bool,
                        dev: CoreDevice, dbias_dtype: Optional[torch.dtype] = None):
    """(dbias or None, dx in FP8) of the activation ``kind`` at the 2-D ``x``, one pass, as
    dact_dbias_quantize() (dbias: dx summed over rows, in dbias_dtype_for(x, dbias_dtype))."""
    rows, cols = x.shape
    device = x.device
    dx, dx_desc = _output(rows, cols, x, fp8, dev)
    dbias, dbias_desc, ws, ws_ptr, ws_size = None, None, None, 0, 0
    if with_dbias:
        dbias = torch.empty(cols, dtype=dbias_dtype_for(x, dbias_dtype), device=device)
        dbias_desc = _float_desc(dbias, dev, "dbias")
        ws_size = _core.dbias_workspace_size(rows, cols, dev.type, dev.index)
        ws, ws_ptr = _scratch(ws_size, dev, device)
    _core.dact_dbias_cast_transpose(kind, _float_desc(grad, dev, "grad"), _float_desc(x, dev, "fwd_input"), dx_desc,
                                    dbias_desc, ws_ptr, ws_size, dev.stream)
    return dbias, dx
