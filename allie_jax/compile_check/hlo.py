"""What XLA's cost analysis leaves out, read from a compiled program's HLO text.

``Compiled.cost_analysis()`` counts every computation once: a ``while`` body (``lax.scan`` over
gradient-accumulation micro-batches, or over scanned layers) contributes one iteration, whatever
its trip count. This module parses the optimised HLO text just enough to put the loops back:

- computations, their instructions (result shape, opcode, operands) and the computations each
  instruction calls (``calls=``, ``body=``, ``condition=``, ``branch_computations=``);
- each loop's trip count, from its condition (``compare(counter, constant(N)), direction=LT``
  with the counter starting at a constant, 0 for every ``lax.scan``); a loop whose bound is a
  run-time value (the search's simulation loop) counts once and is reported as unknown;
- per computation, the matmul FLOPs (``dot`` and ``convolution``, from their shapes) and the
  bytes its instructions read and write (result plus operands; fusion bodies excluded, as they
  stay in registers and on-chip memory; an operand a fusion only slices counts its slices, and
  an in-place ``dynamic-update-slice`` its update: a scanned layer reads one layer of a stack);
- the collectives, by kind, with the bytes of their results.

``scale`` is the ratio "counted with trip counts" / "counted once" for FLOPs and bytes, which
``analysis`` applies to XLA's own totals; a program without loops keeps XLA's numbers exactly.
Where XLA gives no totals (CUDA executables in jax 0.10.2) the absolute counts stand in. Matmul
FLOPs of a convolution include its padded window positions (TPU writes some weight gradients as
padded convolutions), so the absolute count runs high there; as a ratio it cancels. Pallas and
cuDNN kernels (``tpu_custom_call``: splash attention; cuDNN attention) are opaque here as they
are to XLA.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import defaultdict

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")

_BYTES = {
    "pred": 1,
    "s4": 0.5,
    "u4": 0.5,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_NAME = re.compile(r"%([\w.\-]+)")
_FREE = {
    "parameter",
    "constant",
    "tuple",
    "get-tuple-element",
    "bitcast",
    "after-all",
    "partition-id",
    "replica-id",
    "while",
    "conditional",
    "call",
    "copy-start",
    "copy-done",
}


def _elem_bytes(dtype: str) -> float:
    if dtype.startswith("f8"):
        return 1
    return _BYTES.get(dtype, 0)


def shape_bytes(shape: str) -> float:
    """Bytes of every array in an HLO shape string (a tuple's elements summed)."""
    total = 0.0
    for dtype, dims in _ARRAY.findall(shape):
        n = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
        total += n * _elem_bytes(dtype)
    return total


def _dims(shape: str) -> list[int]:
    match = _ARRAY.search(shape)
    if not match or not match.group(2):
        return []
    return [int(d) for d in match.group(2).split(",")]


def _matching(text: str, start: int) -> int:
    """Index just past the bracket that closes the one at ``start``."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] in "([{":
            depth += 1
        elif text[i] in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


@dataclasses.dataclass
class Instruction:
    name: str
    shape: str
    opcode: str
    operands: list[str]
    args: str  # the text between the opcode's parentheses (a constant's value)
    attrs: str
    root: bool


@dataclasses.dataclass
class Computation:
    name: str
    entry: bool
    instructions: list[Instruction] = dataclasses.field(default_factory=list)

    def shapes(self) -> dict[str, str]:
        return {i.name: i.shape for i in self.instructions}


def _instruction(line: str) -> Instruction | None:
    match = _INSTR.match(line)
    if not match:
        return None
    root, name, rest = bool(match.group(1)), match.group(2), match.group(3)
    if rest.startswith("("):
        end = _matching(rest, 0)
    else:
        end = rest.find(" ")
        end = len(rest) if end < 0 else end
    shape, rest = rest[:end], rest[end:].lstrip()
    paren = rest.find("(")
    if paren < 0:
        return None
    opcode = rest[:paren].strip()
    close = _matching(rest, paren)
    operands = _NAME.findall(rest[paren:close])
    return Instruction(
        name, shape, opcode, operands, rest[paren + 1 : close - 1], rest[close:], root
    )


def parse(text: str) -> dict[str, Computation]:
    """Computations of an HLO module's text, by name (the entry one has ``entry=True``)."""
    comps: dict[str, Computation] = {}
    current: Computation | None = None
    for line in text.splitlines():
        if current is None:
            match = _HEADER.match(line)
            if match:
                current = Computation(match.group(2), bool(match.group(1)))
            continue
        if line.strip() == "}":
            comps[current.name] = current
            current = None
            continue
        instr = _instruction(line)
        if instr is not None:
            current.instructions.append(instr)
    return comps


def _called(attrs: str, key: str) -> list[str]:
    match = re.search(rf"\b{key}=(\{{[^}}]*\}}|%?[\w.\-]+)", attrs)
    if not match:
        return []
    return [n.lstrip("%") for n in re.findall(r"%?[\w.\-]+", match.group(1).strip("{}"))]


def _compare(cond: Computation, comps: dict) -> tuple[Instruction, Instruction, str] | None:
    """(lhs, rhs, direction) of a condition's root compare, looking through a fusion that
    wraps it (XLA:CPU fuses the compare; its operands are then the fusion's)."""
    by_name = {i.name: i for i in cond.instructions}
    root = next((i for i in cond.instructions if i.root), None)
    if root is None:
        return None
    compare, operands = root, root.operands
    if root.opcode == "fusion":
        fused = comps.get(next(iter(_called(root.attrs, "calls")), ""))
        inner = next((i for i in fused.instructions if i.root), None) if fused else None
        if inner is None or inner.opcode != "compare":
            return None
        params = {i.name: int(i.args) for i in fused.instructions if i.opcode == "parameter"}
        if any(o not in params for o in inner.operands):
            return None
        compare = inner
        operands = [root.operands[params[o]] for o in inner.operands]
    direction = re.search(r"direction=(\w+)", compare.attrs)
    if compare.opcode != "compare" or len(operands) != 2 or direction is None:
        return None
    lhs, rhs = (by_name.get(n) for n in operands)
    if lhs is None or rhs is None:
        return None
    return lhs, rhs, direction.group(1)


def trip_count(while_instr: Instruction, caller: Computation, comps: dict) -> int | None:
    """The loop's iterations: XLA's ``known_trip_count`` when it wrote one, else from a condition
    that compares the loop counter with a constant; None for a run-time bound."""
    known = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', while_instr.attrs)
    if known:
        return int(known.group(1))
    cond = comps.get(next(iter(_called(while_instr.attrs, "condition")), ""))
    found = _compare(cond, comps) if cond is not None else None
    if found is None:
        return None
    lhs, rhs, direction = found
    if lhs.opcode == "constant":  # N > i is i < N
        lhs, rhs = rhs, lhs
        direction = {"GT": "LT", "GE": "LE"}.get(direction, "")
    if rhs.opcode != "constant" or lhs.opcode != "get-tuple-element":
        return None
    bound = _constant(rhs)
    index = re.search(r"index=(\d+)", lhs.attrs)
    if bound is None or index is None or direction not in ("LT", "LE"):
        return None
    start = _loop_start(while_instr, caller, int(index.group(1)))
    return max(bound - start + (1 if direction == "LE" else 0), 0)


def _constant(instr: Instruction) -> int | None:
    try:
        return int(instr.args)
    except ValueError:  # not an integer scalar
        return None


def _loop_start(while_instr: Instruction, caller: Computation, index: int) -> int:
    """The counter's initial value when the caller builds it from a constant; else 0."""
    by_name = {i.name: i for i in caller.instructions}
    init = by_name.get(while_instr.operands[0]) if while_instr.operands else None
    if init is None or init.opcode != "tuple" or index >= len(init.operands):
        return 0
    element = by_name.get(init.operands[index])
    if element is not None and element.opcode == "constant":
        return _constant(element) or 0
    return 0


def _conv_flops(instr: Instruction, shapes: dict[str, str]) -> float:
    out = math.prod(_dims(instr.shape)) if _dims(instr.shape) else 1
    if len(instr.operands) < 2:
        return 0.0
    rhs = _dims(shapes.get(instr.operands[1], ""))
    labels = re.search(r"dim_labels=[^_]+_([^-]+)->", instr.attrs)
    if not rhs or labels is None or "o" not in labels.group(1):
        return 0.0
    return 2.0 * out * math.prod(rhs) / rhs[labels.group(1).index("o")]


def _dot_flops(instr: Instruction, shapes: dict[str, str]) -> float:
    out = math.prod(_dims(instr.shape)) if _dims(instr.shape) else 1
    lhs = _dims(shapes.get(instr.operands[0], "")) if instr.operands else []
    contracting = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", instr.attrs)
    k = 1
    if contracting and contracting.group(1) and lhs:
        k = math.prod(lhs[int(d)] for d in contracting.group(1).split(","))
    return 2.0 * out * k


def _gemm_flops(instr: Instruction, shapes: dict[str, str]) -> float:
    """A cuBLAS matmul custom call (GPU): contracting dimensions sit in its backend config."""
    out = math.prod(_dims(instr.shape)) if _dims(instr.shape) else 1
    lhs = _dims(shapes.get(instr.operands[0], "")) if instr.operands else []
    contracting = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', instr.attrs)
    if not lhs or contracting is None:
        return 0.0
    dims = [int(d) for d in re.findall(r"\d+", contracting.group(1))]
    return 2.0 * out * math.prod(lhs[d] for d in dims if d < len(lhs))


def matmul_flops(instr: Instruction, shapes: dict[str, str]) -> float:
    """2 x output elements x contracted size for dot, convolution and cuBLAS calls; else 0."""
    if instr.opcode == "dot":
        return _dot_flops(instr, shapes)
    if instr.opcode == "convolution":
        return _conv_flops(instr, shapes)
    if instr.opcode == "custom-call" and re.search(r'custom_call_target="__cublas', instr.attrs):
        return _gemm_flops(instr, shapes)
    return 0.0


_SLICES = ("dynamic-slice", "slice")


def _parameter_index(instr: Instruction) -> int | None:
    if instr.opcode != "parameter":
        return None
    try:
        return int(instr.args.strip())
    except ValueError:
        return None


def _fusion_operand_bytes(body: Computation) -> tuple[dict[int, float], bool]:
    """({operand index: bytes the fusion really touches}, whether it updates a buffer in place).

    A scanned loop's body reads one layer of each stacked array (a ``dynamic-slice`` of it inside
    a fusion) and writes one layer of each stacked gradient or residual (a ``dynamic-update-slice``
    at the fusion's root, done in place). Counting the whole ``[layers, ...]`` operand at every
    iteration would charge each step the full stack once per layer, as XLA's own cost analysis
    does not; here an operand only sliced counts its slices, and an in-place update counts the
    update, not the buffer.
    """
    users: dict[str, list[Instruction]] = {}
    for instr in body.instructions:
        for o in instr.operands:
            users.setdefault(o, []).append(instr)
    root = next((i for i in body.instructions if i.root), None)
    in_place = root is not None and root.opcode == "dynamic-update-slice"
    touched: dict[int, float] = {}
    for instr in body.instructions:
        index = _parameter_index(instr)
        if index is None:
            continue
        uses = users.get(instr.name, [])
        if uses and all(u.opcode in _SLICES and u.operands[:1] == [instr.name] for u in uses):
            touched[index] = sum(shape_bytes(u.shape) for u in uses)
        elif in_place and root.operands[:1] == [instr.name]:
            touched[index] = 0.0  # the buffer updated in place: only the update moves
    return touched, in_place


def _instr_bytes(
    instr: Instruction, shapes: dict[str, str], comps: dict[str, Computation] | None = None
) -> float:
    if instr.opcode in _FREE:
        return 0.0
    operand_bytes = [shape_bytes(shapes.get(o, "")) for o in instr.operands]
    if instr.opcode == "dynamic-slice":
        return 2 * shape_bytes(instr.shape)
    if instr.opcode == "dynamic-update-slice" and len(operand_bytes) > 1:
        return 2 * operand_bytes[1]  # in place: the update is read and written
    if instr.opcode == "fusion" and comps is not None:
        bodies = [comps[c] for c in _called(instr.attrs, "calls") if c in comps]
        if bodies:
            touched, in_place = _fusion_operand_bytes(bodies[0])
            for index, b in touched.items():
                if index < len(operand_bytes):
                    operand_bytes[index] = b
            if in_place:
                update = bodies[0].shapes()
                root = next(i for i in bodies[0].instructions if i.root)
                result = (
                    shape_bytes(update.get(root.operands[1], "")) if len(root.operands) > 1 else 0.0
                )
                return result + sum(operand_bytes)
    return shape_bytes(instr.shape) + sum(operand_bytes)


def collective_kind(opcode: str) -> str | None:
    """The collective an opcode runs (its ``-done`` half for async pairs), None otherwise."""
    base = opcode.removesuffix("-done")
    if opcode.endswith("-start"):
        return None
    return base if base in COLLECTIVES else None


@dataclasses.dataclass
class HloSummary:
    """Loop-aware totals of one compiled program."""

    matmul_flops: float  # with trip counts
    bytes_moved: float  # read and written by unfused instructions, with trip counts
    flops_scale: float  # matmul FLOPs with trip counts / counted once
    bytes_scale: float  # bytes read and written with trip counts / counted once
    loops_known: int
    loops_unknown: int  # loops with a run-time bound: counted once
    collectives: dict[str, int]  # kind -> executions per step
    collective_bytes: dict[str, float]  # kind -> result bytes per step, per device


def summarize(text: str) -> HloSummary:
    comps = parse(text)
    entry = next((c for c in comps.values() if c.entry), None)
    with_trips: dict[str, float] = defaultdict(float)
    once: dict[str, float] = defaultdict(float)
    fused: set[str] = set()
    known = unknown = 0
    if entry is not None:
        with_trips[entry.name] = once[entry.name] = 1.0
    # The text lists callees before their callers (post-order), so walking it backwards sees
    # every caller's multiplicity complete before it passes it on.
    order = []
    for name in reversed(comps):
        comp = comps[name]
        if not once.get(name):
            continue
        order.append(name)
        for instr in comp.instructions:
            trips = 1
            if instr.opcode == "while":
                count = trip_count(instr, comp, comps)
                if count is None:
                    unknown += 1
                else:
                    known += 1
                    trips = count
            if instr.opcode.endswith("-done") or instr.opcode == "async-update":
                continue  # the -start half already called it
            for key in ("calls", "body", "condition", "branch_computations"):
                for callee in _called(instr.attrs, key):
                    if callee not in comps:
                        continue
                    factor = trips if key in ("body", "condition") else 1
                    with_trips[callee] += with_trips[name] * factor
                    once[callee] += once[name]
                    if instr.opcode == "fusion":
                        fused.add(callee)
    flops = {"trips": 0.0, "once": 0.0}
    moved = {"trips": 0.0, "once": 0.0}
    collectives: dict[str, int] = defaultdict(int)
    collective_bytes: dict[str, float] = defaultdict(float)
    for name in order:
        comp = comps[name]
        shapes = comp.shapes()
        for instr in comp.instructions:
            f = matmul_flops(instr, shapes)
            b = 0.0 if name in fused else _instr_bytes(instr, shapes, comps)
            flops["trips"] += f * with_trips[name]
            flops["once"] += f * once[name]
            moved["trips"] += b * with_trips[name]
            moved["once"] += b * once[name]
            kind = collective_kind(instr.opcode)
            if kind is not None:
                collectives[kind] += round(with_trips[name])
                collective_bytes[kind] += shape_bytes(instr.shape) * with_trips[name]
    return HloSummary(
        matmul_flops=flops["trips"],
        bytes_moved=moved["trips"],
        flops_scale=flops["trips"] / flops["once"] if flops["once"] else 1.0,
        bytes_scale=moved["trips"] / moved["once"] if moved["once"] else 1.0,
        loops_known=known,
        loops_unknown=unknown,
        collectives={k: collectives.get(k, 0) for k in COLLECTIVES},
        collective_bytes={k: collective_bytes.get(k, 0.0) for k in COLLECTIVES},
    )
