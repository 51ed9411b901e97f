# Type stubs of the compiled module lmdbio._datum (_datum.pyx): the Caffe
# Datum / BlobProto decoder and batch transformer under lmdbio.datum.
# Checked against the built module by `make stubtest` (mypy's stubtest).
from typing import Any

from lmdbio.errors import DatumError as DatumError

UINT8: int
FLOAT: int
ENCODED: int

def parse(buf: Any, what: str | None = None, index: int | None = None) -> dict[str, Any]: ...
def floats(buf: Any, out: Any) -> None: ...
def decode_batch(data: Any, offsets: Any, kind: int, c: int, h: int, w: int, out: Any,
                 labels: Any, data_off: Any = None, data_len: Any = None,
                 what: str | None = None, nthreads: int = 1) -> None: ...
def parse_blob(buf: Any, what: str | None = None) -> tuple[Any, Any, Any]: ...
def transform(src: Any, out: Any, crop: int, h_off: Any, w_off: Any, mirror: Any,
              mean: Any, mean_values: Any, scale: float) -> None: ...
