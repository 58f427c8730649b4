"""The files an ONNX model is made of: the ``.onnx`` file and its external data files.

``torch.onnx.export`` (since torch 2.9 by default) and ``onnx.save_model(...,
save_as_external_data=True)`` keep the weights beside the graph, in files the model
names by a ``location`` relative to its folder (``model.onnx.data``).  The ``.onnx``
file then holds the graph only, the same bytes for every epoch of one architecture: a
hash of it alone says nothing about the weights.  :func:`external_data_files` lists
those files, so that the model's hash, the pipeline's rerun check and the
changed-while-reading check cover them; :func:`model_sha256` is the hash recorded.

The ``onnx`` package is not a dependency of the ``onnx`` extra (onnxruntime is), so
the model is read here as protobuf wire format, walking only the messages that can
hold tensors::

    ModelProto.graph (7), .training_info (20: initialization 1, algorithm 2),
        .functions (25: FunctionProto.node 7)
    GraphProto.node (1), .initializer (5), .sparse_initializer (15)
    NodeProto.attribute (5): AttributeProto.t (5), .g (6), .tensors (10), .graphs (11),
        .sparse_tensor (22), .sparse_tensors (23)
    SparseTensorProto.values (1), .indices (2)
    TensorProto.external_data (13): StringStringEntryProto key (1) / value (2),
        .data_location (14): 1 = EXTERNAL

Every other field (the tensors' raw bytes included) is skipped by its length, never
read, so a model of embedded weights costs a walk over its structure only.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from pathlib import Path

from .errors import RankwiseError

# message -> {field number: message it holds}; a tensor is where locations are read
_MODEL, _GRAPH, _NODE, _ATTRIBUTE, _TENSOR, _SPARSE, _TRAINING, _FUNCTION = range(8)
_CHILDREN = {
    _MODEL: {7: _GRAPH, 20: _TRAINING, 25: _FUNCTION},
    _TRAINING: {1: _GRAPH, 2: _GRAPH},
    _FUNCTION: {7: _NODE},
    _GRAPH: {1: _NODE, 5: _TENSOR, 15: _SPARSE},
    _NODE: {5: _ATTRIBUTE},
    _ATTRIBUTE: {5: _TENSOR, 6: _GRAPH, 10: _TENSOR, 11: _GRAPH, 22: _SPARSE, 23: _SPARSE},
    _SPARSE: {1: _TENSOR, 2: _TENSOR},
}


class _Malformed(Exception):
    pass


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _Malformed
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(buf, pos: int, end: int):
    """``(field number, start, stop)`` of each length-delimited field in
    ``buf[pos:end]`` (other wire types skipped); ``start`` is None for a varint field,
    whose value is then ``stop``."""
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos, end)
            yield number, None, value
        elif wire == 1:
            pos += 8
        elif wire == 2:
            length, pos = _varint(buf, pos, end)
            if pos + length > end:
                raise _Malformed
            yield number, pos, pos + length
            pos += length
        elif wire == 5:
            pos += 4
        else:  # groups (3, 4) are not in ONNX's schema
            raise _Malformed
    if pos != end:
        raise _Malformed


def _locations(buf, kind: int, pos: int, end: int, found: dict[str, None], depth: int) -> None:
    if depth > 64:  # subgraphs nest; a loop would be a malformed file
        raise _Malformed
    if kind == _TENSOR:
        external, location = False, None
        for number, start, stop in _fields(buf, pos, end):
            if number == 14 and start is None:
                external = stop == 1
            elif number == 13 and start is not None:
                entry = {
                    n: bytes(buf[a:b]) for n, a, b in _fields(buf, start, stop) if a is not None
                }
                if entry.get(1) == b"location" and 2 in entry:
                    location = entry[2].decode("utf-8", "replace")
        if external and location:
            found.setdefault(location)
        return
    children = _CHILDREN[kind]
    for number, start, stop in _fields(buf, pos, end):
        if start is not None and number in children:
            _locations(buf, children[number], start, stop, found, depth + 1)


def external_data_files(model: str | os.PathLike) -> list[Path]:
    """The external data files ``model`` names (each once, in the order the file holds
    them: a fixed order for :func:`model_sha256`),
    resolved against the model's folder; ``[]`` for a model of embedded weights.  A
    file that does not parse as an ONNX model gives ``[]`` (onnxruntime says what is
    wrong with it); a location that leaves the model's folder is an error, as it is
    for onnxruntime."""
    path = Path(model)
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size == 0:
                return []
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                found: dict[str, None] = {}
                _locations(buf, _MODEL, 0, size, found, 0)
    except (OSError, ValueError, _Malformed):
        return []
    folder = path.parent
    files = []
    for location in found:
        target = folder / location
        if Path(location).is_absolute() or ".." in Path(location).parts:
            raise RankwiseError(
                f"{path}: external data location {location!r} is outside the model's "
                "folder; save the model with its data files beside it"
            )
        files.append(target)
    return files


def model_sha256(model: str | os.PathLike, files: list[Path] | None = None) -> str:
    """sha256 of an ONNX model's bytes: the ``.onnx`` file's own hash when its weights
    are embedded (as recorded before external data was tracked), else the sha256 of the
    lines ``<location>\\t<sha256>`` of the model file and each external data file in
    order, so that new weights give a new hash.  A data file that is missing is an
    error naming it."""
    from .hashing import file_sha256

    path = Path(model)
    files = external_data_files(path) if files is None else files
    own = file_sha256(path)
    if not files:
        return own
    lines = [f"{path.name}\t{own}"]
    for data in files:
        if not data.is_file():
            raise RankwiseError(
                f"{path}: its external data file {data} is missing; copy it beside the "
                "model (torch.onnx.export writes it next to the .onnx file)"
            )
        lines.append(f"{os.path.relpath(data, path.parent)}\t{file_sha256(data)}")
    return hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()
