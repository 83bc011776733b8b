"""A build's token vectors as stored: the plain storages (float16, int8 with per-vector scales) or a stateless
codec's codes (:mod:`index_builder.snapshot.token_codes`), passage by passage."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from index_builder.settings import STORAGES, CodecSpec, check_storage
from index_builder.snapshot.token_codes import TokenCodec, quantize_int8


@dataclass
class TokenStore:
    """Token vectors back to back: ``vectors`` [T, d] (float16, or int8 with ``scales`` [T]; for a codec
    ``storage``, its codes [T, B] and scales), ``offsets`` [passages + 1] (passage i owns rows
    ``offsets[i]:offsets[i+1]``; with a pooling codec T counts pooled vectors, and ``groups`` [tokens before
    pooling] with ``group_offsets`` [passages + 1] give each original token's pooled row)."""

    vectors: np.ndarray
    offsets: np.ndarray
    scales: np.ndarray | None = None
    storage: str = "int8"
    groups: np.ndarray | None = None
    group_offsets: np.ndarray | None = None

    @classmethod
    def from_lists(cls, per_passage: Sequence[np.ndarray], dim: int, storage: str) -> TokenStore:
        """Passages' token vectors (float [t_i, dim] each) stored in ``storage``."""
        lengths = np.array([len(v) for v in per_passage], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        flat = (np.concatenate([np.asarray(v, dtype=np.float32) for v in per_passage]) if len(per_passage)
                else np.zeros((0, dim), np.float32)).reshape(-1, dim)
        if storage == "int8":
            q, scales = quantize_int8(flat)
            return cls(q, offsets, scales, storage)
        if storage == "float16":
            return cls(flat.astype(np.float16), offsets, None, storage)
        storage = check_storage(storage)
        codes = TokenCodec(CodecSpec.parse(storage), dim).encode_passages(flat, offsets)
        return cls(codes.codes, codes.offsets, codes.scales, storage, codes.groups, codes.group_offsets)

    def floats(self, passage: int) -> np.ndarray:
        """One passage's token vectors as float32 [t, d]: what a store of another storage is made from
        (:meth:`from_lists`). Only the plain storages keep them; a codec's codes cannot be re-coded."""
        if self.storage not in STORAGES:
            raise ValueError(f"a {self.storage} token store cannot be re-stored in another form: rebuild it from "
                             f"the model (its vectors are pooled or quantised past recovery)")
        lo, hi = int(self.offsets[passage]), int(self.offsets[passage + 1])
        out = np.asarray(self.vectors[lo:hi], dtype=np.float32)
        if self.scales is not None:
            out = out * np.asarray(self.scales[lo:hi], dtype=np.float32)[:, None]
        return out

    @property
    def nbytes(self) -> int:
        return int(self.vectors.nbytes + self.offsets.nbytes + sum(
            a.nbytes for a in (self.scales, self.groups, self.group_offsets) if a is not None))
