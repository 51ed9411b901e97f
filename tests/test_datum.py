"""lmdbio.datum (docs/caffe-pytorch.md): the C Datum decoder, encode, read_mean,
Transform and DatumReader.

The oracle is protobuf itself: Caffe's Datum and BlobProto are defined
through protobuf's descriptor API in tests/caffe_pb.py (no Caffe needed).
Transforms are checked against a straightforward per-pixel reimplementation
of Caffe's DataTransformer::Transform (below) drawing the same random
numbers.  LMDB files are written with py-lmdb.
"""

from __future__ import annotations

import importlib.util
import os
import struct
import threading

import lmdb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from caffe_pb import (BlobProto, BlobProtoUnpacked, BlobShape, Datum,
                      DatumExtra, DatumPacked, parse_datum)
from conftest import require_lmdbio, spec_shard

try:
    import lmdbio
    from lmdbio import datum as ld
except Exception as exc:  # pragma: no cover - a broken build
    if require_lmdbio():
        raise
    pytest.skip("lmdbio cannot be imported: %r" % (exc,), allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _have(mod):
    return importlib.util.find_spec(mod) is not None


BACKENDS = [b for b, m in (("cv2", "cv2"), ("pil", "PIL")) if _have(m)]


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture(params=BACKENDS or [None])
def backend(request, monkeypatch):
    if request.param is None:
        pytest.skip("neither OpenCV nor Pillow is installed")
    from lmdbio import _images
    monkeypatch.setattr(_images, "_BACKEND", request.param)
    return request.param


def pb(shape=(3, 4, 5), label=0, seed=0, cls=Datum, floats=False, **kw):
    """A protobuf Datum message with random content."""
    rng = np.random.default_rng(seed)
    c, h, w = shape
    m = cls(channels=c, height=h, width=w, label=label, **kw)
    if floats:
        m.float_data.extend(rng.standard_normal(c * h * w).astype(np.float32).tolist())
    else:
        m.data = rng.integers(0, 256, c * h * w, dtype=np.uint8).tobytes()
    return m


def pixels(m):
    """What a decoder must return for protobuf Datum m."""
    shape = (m.channels, m.height, m.width)
    if m.data:
        return np.frombuffer(m.data, np.uint8).reshape(shape)
    return np.array(m.float_data, dtype=np.float32).reshape(shape)


def write_lmdb(path, values, keys=None):
    env = lmdb.open(str(path), map_size=1 << 28)
    with env.begin(write=True) as txn:
        for i, v in enumerate(values):
            txn.put(keys[i] if keys else b"%08d" % i, v)
    env.close()
    return str(path)


# ---------------------------------------------------------------------------
# decoding against protobuf


@pytest.mark.parametrize("label", [0, 1, 9, -1, -7, 2**31 - 1, -2**31])
def test_decode_one_raw_labels(label):
    m = pb(label=label)
    arr, lab = ld.decode_one(m.SerializeToString())
    assert lab == label and isinstance(lab, int)
    assert arr.dtype == np.uint8 and arr.shape == (3, 4, 5)
    assert np.array_equal(arr, pixels(m))


@pytest.mark.parametrize("cls", [Datum, DatumPacked], ids=["unpacked", "packed"])
def test_float_data_both_encodings(cls):
    m = pb((2, 3, 4), label=-3, floats=True, cls=cls)
    raw = m.SerializeToString()
    packed_tag = b"\x32" in raw[:12] or cls is DatumPacked
    assert (raw.count(b"\x35") >= 24) == (cls is Datum) or packed_tag
    arr, lab = ld.decode_one(raw)
    assert arr.dtype == np.float32 and lab == -3
    assert np.array_equal(arr, pixels(m))
    data, labels = ld.decode([raw, raw])
    assert data.dtype == np.float32 and data.shape == (2, 2, 3, 4)
    assert np.array_equal(data[1], pixels(m)) and labels.tolist() == [-3, -3]


def test_float_data_mixed_packed_and_unpacked_chunks():
    a = DatumPacked(float_data=[1.5, 2.5]).SerializeToString()
    b = Datum(channels=1, height=1, width=5, float_data=[3.5, 4.5, 5.5]).SerializeToString()
    raw = a + b  # protobuf merges: repeated values accumulate
    ref = parse_datum(raw)
    arr, _ = ld.decode_one(raw)
    assert arr.ravel().tolist() == list(ref.float_data) == [1.5, 2.5, 3.5, 4.5, 5.5]


def test_last_singular_field_wins_and_merge():
    a = pb((3, 4, 5), label=4, seed=1)
    b = pb((1, 2, 2), label=-9, seed=2)
    raw = a.SerializeToString() + b.SerializeToString()
    ref = parse_datum(raw)
    arr, lab = ld.decode_one(raw)
    assert lab == ref.label == -9
    assert np.array_equal(arr, pixels(ref))


def test_fields_in_any_order():
    m = pb((2, 3, 3), label=5)
    parts = [Datum(channels=2).SerializeToString(), Datum(label=5).SerializeToString(),
             Datum(data=m.data).SerializeToString(), Datum(width=3).SerializeToString(),
             Datum(height=3).SerializeToString()]
    raw = b"".join(reversed(parts))
    arr, lab = ld.decode_one(raw)
    assert lab == 5 and np.array_equal(arr, pixels(m))


def test_unknown_fields_of_every_wire_type_are_skipped():
    m = DatumExtra(channels=1, height=2, width=2, data=b"\x01\x02\x03\x04", label=-2,
                   x_varint=-5, x_fixed64=2**63, x_bytes=b"\xff" * 300, x_fixed32=7,
                   x_sint=-12345, x_doubles=[1.0, 2.0], x_strings=["a", "bc"])
    raw = m.SerializeToString()
    # a group (wire types 3/4) too, which protobuf skips as well
    raw += b"\x6b" + b"\x08\x01" + b"\x73\x78\x02\x74" + b"\x6c"  # group 13{f1, group 14{f15}}
    ref = parse_datum(raw)
    arr, lab = ld.decode_one(raw)
    assert lab == ref.label == -2
    assert np.array_equal(arr, pixels(ref))


def test_encoded_false_and_absent_fields():
    m = Datum(channels=1, height=1, width=3, data=b"abc")  # no label, no encoded
    arr, lab = ld.decode_one(m.SerializeToString())
    assert lab == 0 and arr.tobytes() == b"abc"
    arr, lab = ld.decode_one(b"")  # the empty Datum: 0x0x0
    assert arr.shape == (0, 0, 0) and lab == 0


def test_decode_batch_inputs():
    msgs = [pb((3, 4, 5), label=i - 3, seed=i) for i in range(7)]
    raws = [m.SerializeToString() for m in msgs]
    want = np.stack([pixels(m) for m in msgs])
    for values in (raws, tuple(raws), [bytearray(r) for r in raws],
                   [memoryview(r) for r in raws]):
        data, labels = ld.decode(values)
        assert np.array_equal(data, want)
        assert labels.dtype == np.int64 and labels.tolist() == list(range(-3, 4))
    # a Ragged (as Reader batches carry)
    from lmdbio.reader import Ragged
    lens = [len(r) for r in raws]
    offs = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    rag = Ragged(np.frombuffer(b"".join(raws), np.uint8), offs)
    data, labels = ld.decode(rag)
    assert np.array_equal(data, want)
    # a 2-D array of equal-length records
    same = [pb((3, 4, 5), label=1, seed=i).SerializeToString() for i in range(7)]
    data, _ = ld.decode(np.stack([np.frombuffer(r, np.uint8) for r in same]))
    assert np.array_equal(data, want)
    # empty batch
    data, labels = ld.decode([])
    assert data.shape[0] == 0 and labels.shape == (0,)
    with pytest.raises(TypeError):
        ld.decode(raws[0])


@given(c=st.integers(0, 4), h=st.integers(0, 6), w=st.integers(0, 6),
       label=st.integers(-2**31, 2**31 - 1), floats=st.booleans(),
       packed=st.booleans(), n=st.integers(1, 5), seed=st.integers(0, 2**16))
@settings(max_examples=200)
def test_decode_matches_protobuf(c, h, w, label, floats, packed, n, seed):
    cls = DatumPacked if packed else Datum
    floats = floats and c * h * w > 0
    msgs = [pb((c, h, w), label=label, seed=seed + i, cls=cls, floats=floats)
            for i in range(n)]
    raws = [m.SerializeToString() for m in msgs]
    data, labels = ld.decode(raws)
    assert data.shape == (n, c, h, w)
    assert data.dtype == (np.float32 if floats else np.uint8)
    for i, m in enumerate(msgs):
        ref = parse_datum(raws[i])
        assert np.array_equal(data[i], pixels(ref))
        assert labels[i] == ref.label
        one, lab = ld.decode_one(raws[i])
        assert np.array_equal(one, data[i]) and lab == ref.label


@given(st.binary(max_size=64))
@settings(max_examples=400)
def test_random_bytes_never_crash(buf):
    """Any bytes: a result that protobuf agrees with, or DatumError."""
    try:
        arr, lab = ld.decode_one(buf)
    except lmdbio.DatumError:
        return
    ref = parse_datum(buf)  # lmdbio accepted it: protobuf must too
    assert lab == ref.label
    assert np.array_equal(arr, pixels(ref))


@given(st.data())
@settings(max_examples=300)
def test_mutated_datums(data):
    """Truncations and byte flips of a valid Datum: protobuf's verdict on
    the wire format holds (what it rejects, lmdbio rejects)."""
    m = pb((2, 3, 2), label=data.draw(st.integers(-5, 5)),
           floats=data.draw(st.booleans()), cls=data.draw(st.sampled_from([Datum, DatumPacked])))
    raw = bytearray(m.SerializeToString())
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    raw = bytes(raw[:data.draw(st.integers(0, len(raw)))])
    try:
        ref = parse_datum(raw)
    except Exception:
        ref = None
    try:
        arr, lab = ld.decode_one(raw)
    except lmdbio.DatumError:
        return
    assert ref is not None, "lmdbio accepted bytes protobuf rejects"
    # (a flipped byte can make a float NaN, which equals no NaN: the NaNs
    # must sit in the same places)
    want = pixels(ref)
    assert lab == ref.label and np.array_equal(
        arr, want, equal_nan=arr.dtype.kind == want.dtype.kind == "f")


# ---------------------------------------------------------------------------
# malformed input

GOOD = Datum(channels=1, height=2, width=2, data=b"abcd", label=3,
             encoded=False).SerializeToString()

MALFORMED = {
    "truncated tag varint": b"\x80",
    "truncated value varint": b"\x08\x83",
    "truncated negative label": b"\x28\xff\xff\xff",
    "varint longer than 10 bytes": b"\x28" + b"\xff" * 10 + b"\x01",
    "length past the end": b"\x08\x01\x10\x02\x18\x02\x22\x05abcd",
    "huge length": b"\x22\xff\xff\xff\xff\xff\xff\xff\xff\x7f",
    "invalid wire type 6": b"\x0e",
    "invalid wire type 7": b"\x4f",
    "field number 0": b"\x00\x01",
    "end group without start": b"\x44",
    "unclosed group": b"\x43\x08\x01",
    "mismatched end group": b"\x43\x4c",
    "truncated fixed32": b"\x35\x00\x00",
    "truncated fixed64 unknown": b"\x49\x00\x00",
    "packed floats not a multiple of 4": b"\x32\x03\x00\x00\x00",
    "size mismatch": b"\x08\x01\x10\x02\x18\x02\x22\x03abc",
    "data without sizes": b"\x22\x03abc",
    "sizes without data": b"\x08\x03\x10\x20\x18\x20",
    "negative channels": b"\x08" + b"\xff" * 9 + b"\x01" + b"\x22\x00",
    "overflowing size": b"\x08\xff\xff\xff\xff\x07\x10\xff\xff\xff\xff\x07\x18\xff\xff\xff\xff\x07",
    "float count mismatch": Datum(channels=1, height=1, width=3,
                                  float_data=[1.0, 2.0]).SerializeToString(),
    "encoded without data": b"\x38\x01",
    "tag out of range": b"\xf8\xff\xff\xff\x1f\x01",
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_raises_datum_error_naming_the_record(name):
    bad = MALFORMED[name]
    with pytest.raises(lmdbio.DatumError) as ei:
        ld.decode_one(bad)
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, lmdbio.Error)
    with pytest.raises(lmdbio.DatumError, match=r"^record 2: malformed"):
        ld.decode([GOOD, GOOD, bad, GOOD])
    with pytest.raises(lmdbio.DatumError, match=r"^record 0: malformed"):
        ld.decode([bad, GOOD])


def test_malformed_messages_say_what():
    def msg(b):
        with pytest.raises(lmdbio.DatumError) as ei:
            ld.decode([b])
        return str(ei.value)
    assert "truncated varint" in msg(b"\x08\x83")
    assert "past the end" in msg(b"\x22\x05abcd")
    assert "wire type 6" in msg(b"\x0e")
    assert "data has 3 bytes, 1x2x2 needs 4" in msg(b"\x08\x01\x10\x02\x18\x02\x22\x03abc")
    assert "overflows" in msg(MALFORMED["overflowing size"])
    assert "negative" in msg(MALFORMED["negative channels"])


def test_mixed_shapes_and_kinds_name_the_first_odd_record():
    a = pb((3, 4, 5)).SerializeToString()
    b = pb((3, 5, 4)).SerializeToString()
    f = pb((3, 4, 5), floats=True).SerializeToString()
    with pytest.raises(ValueError, match=r"^record 3 has shape 3x5x4") as ei:
        ld.decode([a, a, a, b, a, b])
    assert not isinstance(ei.value, lmdbio.DatumError)
    with pytest.raises(ValueError, match=r"^record 1 is a float_data Datum"):
        ld.decode([a, f])
    png = ld.encode(np.zeros((3, 4, 5), np.uint8), 1, encoded=True)
    with pytest.raises(ValueError, match=r"^record 2 is an encoded Datum, the batch's first record is a raw uint8 one"):
        ld.decode([a, a, png])


@pytest.mark.parametrize("threads", [1, 2, 3, 7])
def test_threaded_decode_names_the_first_bad_record(threads):
    raws = [pb((3, 4, 5), label=i, seed=i).SerializeToString() for i in range(40)]
    want = np.stack([pixels(parse_datum(r)) for r in raws])
    data, labels = ld.decode(raws, threads=threads)
    assert np.array_equal(data, want) and labels.tolist() == list(range(40))
    bad = list(raws)
    bad[33] = bad[33][:-3]
    bad[25] = pb((3, 5, 4)).SerializeToString()
    bad[31] = b"\x0e"
    with pytest.raises(ValueError, match=r"^record 25 has shape") as ei:
        ld.decode(bad, threads=threads)
    assert not isinstance(ei.value, lmdbio.DatumError)
    bad[25] = raws[25]
    with pytest.raises(lmdbio.DatumError, match=r"^record 31: "):
        ld.decode(bad, threads=threads)


def test_big_batch_decodes_in_threads_by_default():
    raws = [pb((3, 64, 64), label=i, seed=i).SerializeToString() for i in range(900)]
    assert sum(map(len, raws)) >= ld._THREADED_BYTES
    data, labels = ld.decode(raws)
    assert np.array_equal(data[[0, 450, 899]],
                          np.stack([pixels(parse_datum(raws[i])) for i in (0, 450, 899)]))
    raws[700] = raws[700][:100]
    with pytest.raises(lmdbio.DatumError, match=r"^record 700: "):
        ld.decode(raws)


def test_decode_into_out():
    raws = [pb((2, 3, 3), seed=i).SerializeToString() for i in range(4)]
    out = np.zeros((4, 2, 3, 3), np.uint8)
    data, _ = ld.decode(raws, out=out)
    assert data is out and np.array_equal(out[2], pixels(parse_datum(raws[2])))
    with pytest.raises(ValueError, match="out must be"):
        ld.decode(raws, out=np.zeros((4, 2, 3, 3), np.float32))


def test_bad_ragged_offsets_are_refused():
    from lmdbio.reader import Ragged
    data = np.frombuffer(GOOD * 3, np.uint8)
    n = len(GOOD)
    for offs in ([0, n, 3 * n + 1], [0, 2 * n, n, 3 * n], [-1, n, 2 * n]):
        with pytest.raises(ValueError, match="offsets"):
            ld.decode(Ragged(data, np.array(offs, np.int64)))


def test_force_flags_exclusive():
    with pytest.raises(ValueError):
        ld.decode([GOOD], force_color=True, force_gray=True)


# ---------------------------------------------------------------------------
# encode


def test_encode_file_is_what_protobuf_writes():
    for label in (None, 0, -3, 7):
        raw = ld.encode_file(b"\x89PNG fake bytes", label)
        kw = {} if label is None else {"label": label}
        assert raw == Datum(data=b"\x89PNG fake bytes", encoded=True,
                            **kw).SerializeToString()


@pytest.mark.parametrize("shape", [(3, 4, 5), (1, 28, 28), (1, 1, 1), (3, 0, 2)])
@pytest.mark.parametrize("label", [None, 0, 7, -1])
def test_encode_is_what_caffe_writes(shape, label):
    a = np.random.default_rng(1).integers(0, 256, shape, dtype=np.uint8)
    m = Datum(channels=shape[0], height=shape[1], width=shape[2], data=a.tobytes(),
              encoded=False)
    if label is not None:
        m.label = label
    raw = ld.encode(a, label)
    assert raw == m.SerializeToString()  # protobuf writes fields in number order
    ref = parse_datum(raw)
    assert (ref.channels, ref.height, ref.width) == shape and not ref.encoded
    arr, lab = ld.decode_one(raw)
    assert np.array_equal(arr, a) and lab == (label or 0)


def test_encode_float_is_array_to_datum():
    a = np.random.default_rng(2).standard_normal((2, 3, 4)).astype(np.float32)
    raw = ld.encode(a, 5)
    m = Datum(channels=2, height=3, width=4, label=5)
    m.float_data.extend(a.ravel().tolist())
    assert raw == m.SerializeToString()
    arr, lab = ld.decode_one(raw)
    assert arr.dtype == np.float32 and np.array_equal(arr, a) and lab == 5
    # float64 values are stored as float (Caffe's float_data)
    arr, _ = ld.decode_one(ld.encode(a.astype(np.float64), 5))
    assert np.array_equal(arr, a)


def test_encode_matches_the_benchmark_generator():
    path = os.path.join(ROOT, "benches", "datasets.py")
    if not os.path.exists(path):
        pytest.skip("benches/datasets.py not in this tree")
    spec = importlib.util.spec_from_file_location("bench_datasets", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    a = np.random.default_rng(3).integers(0, 256, (3, 32, 32), dtype=np.uint8)
    for label in (0, 9, -4):
        assert ld.encode(a, label) == mod.encode_datum(a, label)
    v = mod.record_values("cifar", 0, 3)
    data, labels = ld.decode(v)
    assert data.shape == (3, 3, 32, 32)


def test_encode_rejects():
    with pytest.raises(ValueError):
        ld.encode(np.zeros((2, 2, 2, 2), np.uint8), 0)
    with pytest.raises(ValueError):
        ld.encode(np.zeros((1, 2, 2), np.uint8), 2**31)
    with pytest.raises(ValueError):
        ld.encode(np.zeros((3, 2, 2), np.float32), 0, encoded=True)
    with pytest.raises(ValueError):
        ld.encode(np.zeros((2, 2, 2), np.uint8), 0, encoded=True)  # 2 channels
    with pytest.raises(ValueError):
        ld.encode(np.zeros((1, 2, 2), np.uint8), 0, encoded="gif")
    # 2-D is one channel
    arr, _ = ld.decode_one(ld.encode(np.arange(6, dtype=np.uint8).reshape(2, 3), 1))
    assert arr.shape == (1, 2, 3)


# ---------------------------------------------------------------------------
# encoded (JPEG / PNG) Datums


def _bgr_image(seed, shape=(3, 17, 23)):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, shape, dtype=np.uint8)


@pytest.mark.parametrize("c", [1, 3, 4])
def test_encoded_png_round_trip(backend, c):
    a = _bgr_image(c, (c, 9, 13))
    raw = ld.encode(a, -2, encoded=True)
    m = parse_datum(raw)
    assert m.encoded and m.label == -2 and m.channels == 0 and m.height == 0
    assert m.data.startswith(b"\x89PNG")
    arr, lab = ld.decode_one(raw)
    assert lab == -2 and arr.shape == a.shape and np.array_equal(arr, a)
    data, labels = ld.decode([raw] * 5, threads=3)
    assert data.shape == (5,) + a.shape and np.array_equal(data[4], a)
    assert labels.tolist() == [-2] * 5


def test_png_writer_agrees_with_the_image_libraries():
    a = _bgr_image(4)
    png = ld._png(a)
    if _have("cv2"):
        import cv2
        img = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_UNCHANGED)
        assert np.array_equal(img.transpose(2, 0, 1), a)  # OpenCV gives BGR
    if _have("PIL"):
        import io
        from PIL import Image
        rgb = np.asarray(Image.open(io.BytesIO(png)))
        assert np.array_equal(rgb[:, :, ::-1].transpose(2, 0, 1), a)


def test_encoded_force_color_and_gray(backend):
    grey = _bgr_image(5, (1, 8, 8))
    raw = ld.encode(grey, 0, encoded=True)
    assert ld.decode_one(raw)[0].shape == (1, 8, 8)
    col, _ = ld.decode_one(raw, force_color=True)
    assert col.shape == (3, 8, 8) and all(np.array_equal(col[i], grey[0]) for i in range(3))
    colour = _bgr_image(6, (3, 8, 8))
    raw = ld.encode(colour, 0, encoded=True)
    g, _ = ld.decode([raw, raw], force_gray=True)
    assert g.shape == (2, 1, 8, 8)
    # ITU-R 601 luma of the BGR pixels, within rounding of either library
    b, gr, r = colour.astype(np.float64)
    assert np.abs(g[0, 0] - (0.299 * r + 0.587 * gr + 0.114 * b)).max() <= 1.5


def test_encoded_jpeg_close_to_pixels(backend):
    # smooth content so that JPEG's loss is small
    y, x = np.mgrid[0:32, 0:48]
    a = np.stack([(x * 5) % 256, (y * 7) % 256, ((x + y) * 3) % 256]).astype(np.uint8)
    raw = ld.encode(a, 4, encoded="jpg", quality=98)
    assert parse_datum(raw).data[:2] == b"\xff\xd8"
    arr, lab = ld.decode_one(raw)
    assert arr.shape == a.shape and lab == 4
    assert np.abs(arr.astype(int) - a).mean() < 4  # BGR order kept


def test_jpeg_decoders_agree_within_tolerance():
    if len(BACKENDS) < 2:
        pytest.skip("needs both OpenCV and Pillow")
    y, x = np.mgrid[0:40, 0:40]
    a = np.stack([x * 6, y * 6, (x + y) * 3]).astype(np.uint8)
    raw = ld.encode(a, 0, encoded="jpg")
    got = {}
    from lmdbio import _images
    for b in BACKENDS:
        _images._BACKEND = b
        got[b] = ld.decode([raw])[0].astype(int)
    _images._BACKEND = None
    assert np.abs(got["cv2"] - got["pil"]).max() <= 4


def test_corrupt_image_raises_with_its_index(backend):
    good = ld.encode(_bgr_image(1, (3, 6, 6)), 0, encoded=True)
    m = parse_datum(good)
    bad = Datum(data=m.data[:20] + b"\x00" * 10, label=1, encoded=True).SerializeToString()
    with pytest.raises(lmdbio.DatumError, match=r"^record 3: cannot decode"):
        ld.decode([good, good, good, bad, good, bad], threads=2)
    with pytest.raises(lmdbio.DatumError, match=r"^record 0: cannot decode"):
        ld.decode([bad, good])
    junk = Datum(data=b"not an image at all", encoded=True).SerializeToString()
    with pytest.raises(lmdbio.DatumError):
        ld.decode_one(junk)


def test_encoded_mixed_sizes_name_the_first_odd_record(backend):
    a = ld.encode(_bgr_image(1, (3, 6, 6)), 0, encoded=True)
    b = ld.encode(_bgr_image(2, (3, 6, 7)), 0, encoded=True)
    g = ld.encode(_bgr_image(3, (1, 6, 6)), 0, encoded=True)
    vals = [a] * 10 + [b] + [a] * 5 + [g]
    with pytest.raises(ValueError, match=r"^record 10 has shape 3x6x7"):
        ld.decode(vals, threads=4)
    # the channel count differs (grey file): force_color makes them agree
    data, _ = ld.decode([a, g], force_color=True)
    assert data.shape == (2, 3, 6, 6)


def test_many_encoded_in_threads_equal_one_thread(backend):
    imgs = [_bgr_image(i, (3, 12, 10)) for i in range(64)]
    raws = [ld.encode(im, i, encoded=True) for i, im in enumerate(imgs)]
    d1, l1 = ld.decode(raws, threads=1)
    d4, l4 = ld.decode(raws, threads=4)
    assert np.array_equal(d1, d4) and np.array_equal(d1, np.stack(imgs))
    assert l1.tolist() == l4.tolist() == list(range(64))


# ---------------------------------------------------------------------------
# read_mean (BlobProto)


def _mean(shape=(3, 4, 5), seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_read_mean_legacy_shape(tmp_path):
    m = _mean()
    b = BlobProto(num=1, channels=3, height=4, width=5)
    b.data.extend(m.ravel().tolist())
    p = tmp_path / "mean.binaryproto"
    p.write_bytes(b.SerializeToString())
    got = ld.read_mean(p)
    assert got.dtype == np.float32 and got.shape == (3, 4, 5) and np.array_equal(got, m)


@pytest.mark.parametrize("dims", [(1, 3, 4, 5), (3, 4, 5)])
def test_read_mean_shape_field(tmp_path, dims):
    m = _mean()
    b = BlobProto(shape=BlobShape(dim=list(dims)))
    b.data.extend(m.ravel().tolist())
    p = tmp_path / "m.binaryproto"
    p.write_bytes(b.SerializeToString())
    assert np.array_equal(ld.read_mean(str(p)), m)


def test_read_mean_double_data_and_unpacked(tmp_path):
    m = _mean((1, 2, 3))
    b = BlobProto(num=1, channels=1, height=2, width=3)
    b.double_data.extend(m.astype(np.float64).ravel().tolist())
    b.diff.extend([9.0] * 6)
    p = tmp_path / "d.binaryproto"
    p.write_bytes(b.SerializeToString())
    assert np.array_equal(ld.read_mean(p), m)
    u = BlobProtoUnpacked(num=1, channels=1, height=2, width=3)
    u.data.extend(m.ravel().tolist())
    p.write_bytes(u.SerializeToString())
    assert np.array_equal(ld.read_mean(p), m)


def test_read_mean_errors(tmp_path):
    p = tmp_path / "bad.binaryproto"
    b = BlobProto(num=1, channels=3, height=4, width=5)
    b.data.extend([1.0] * 59)
    p.write_bytes(b.SerializeToString())
    with pytest.raises(lmdbio.DatumError, match="needs 60 values"):
        ld.read_mean(p)
    p.write_bytes(b.SerializeToString()[:-3])
    with pytest.raises(lmdbio.DatumError, match="bad.binaryproto"):
        ld.read_mean(p)
    b = BlobProto(num=2, channels=1, height=1, width=1)
    b.data.extend([1.0, 2.0])
    p.write_bytes(b.SerializeToString())
    with pytest.raises(lmdbio.DatumError, match="num"):
        ld.read_mean(p)
    with pytest.raises(OSError):
        ld.read_mean(tmp_path / "missing")


# ---------------------------------------------------------------------------
# Transform against Caffe's DataTransformer::Transform(const Datum&, Dtype*)


def caffe_transform(datum_pixels, *, scale, mean, mean_values, crop_size, mirror,
                    phase, do_mirror, h_off, w_off):
    """Caffe 1.0's DataTransformer::Transform for ONE datum, transcribed
    loop for loop (float32 arithmetic, as Dtype = float)."""
    C, H, W = datum_pixels.shape
    data = datum_pixels.ravel()
    height, width = (crop_size, crop_size) if crop_size else (H, W)
    if not crop_size:
        h_off = w_off = 0
    out = np.zeros(C * height * width, dtype=np.float32)
    f = np.float32
    for c in range(C):
        for h in range(height):
            for w in range(width):
                data_index = (c * H + h_off + h) * W + w_off + w
                if do_mirror:
                    top_index = (c * height + h) * width + (width - 1 - w)
                else:
                    top_index = (c * height + h) * width + w
                element = f(data[data_index])
                if mean is not None:
                    out[top_index] = f(element - f(mean.ravel()[data_index])) * f(scale)
                elif mean_values is not None:
                    out[top_index] = f(element - f(mean_values[c])) * f(scale)
                else:
                    out[top_index] = element * f(scale)
    return out.reshape(C, height, width)


def reference_batch(data, *, scale=1.0, mean=None, mean_values=None, crop_size=0,
                    mirror=False, phase="train", seed=0):
    """The draws of lmdbio's Transform (its docstring), then Caffe per datum."""
    n, C, H, W = data.shape
    rng = np.random.default_rng(seed)
    mirrors = rng.integers(0, 2, n) if mirror else np.zeros(n, int)
    if crop_size and phase == "train":
        hs = rng.integers(0, H - crop_size + 1, n)
        ws = rng.integers(0, W - crop_size + 1, n)
    else:
        hs = np.full(n, (H - crop_size) // 2)
        ws = np.full(n, (W - crop_size) // 2)
    if mean_values is not None and len(mean_values) == 1:
        mean_values = list(mean_values) * C
    return np.stack([caffe_transform(data[i], scale=scale, mean=mean, mean_values=mean_values,
                                     crop_size=crop_size, mirror=mirror, phase=phase,
                                     do_mirror=bool(mirrors[i]), h_off=int(hs[i]),
                                     w_off=int(ws[i]))
                     for i in range(n)])


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
@pytest.mark.parametrize("crop", [0, 4, 7])
@pytest.mark.parametrize("mirror", [False, True])
@pytest.mark.parametrize("phase", ["train", "test"])
@pytest.mark.parametrize("meanmode", ["none", "file", "one", "per-channel"])
def test_transform_equals_caffe(tmp_path, dtype, crop, mirror, phase, meanmode):
    rng = np.random.default_rng(11)
    n, C, H, W = 6, 3, 7, 9
    if dtype == np.uint8:
        data = rng.integers(0, 256, (n, C, H, W), dtype=np.uint8)
    else:
        data = (rng.standard_normal((n, C, H, W)) * 50).astype(np.float32)
    mean = mean_values = mean_file = None
    if meanmode == "file":
        mean = (rng.random((C, H, W)) * 255).astype(np.float32)
        b = BlobProto(num=1, channels=C, height=H, width=W)
        b.data.extend(mean.ravel().tolist())
        mean_file = tmp_path / "mean.binaryproto"
        mean_file.write_bytes(b.SerializeToString())
    elif meanmode == "one":
        mean_values = [104.5]
    elif meanmode == "per-channel":
        mean_values = [104.0, 117.25, 123.675]
    scale = 0.00390625 if meanmode != "one" else 0.017
    t = ld.Transform(scale=scale, mean_file=mean_file, mean_value=mean_values,
                     crop_size=crop, mirror=mirror, phase=phase, seed=42)
    got = t(data)
    want = reference_batch(data, scale=scale, mean=mean, mean_values=mean_values,
                           crop_size=crop, mirror=mirror, phase=phase, seed=42)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.array_equal(got, want)  # bit for bit


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
@pytest.mark.parametrize("crop", [0, 33, 18])
@pytest.mark.parametrize("meanmode", ["file", "values"])
def test_transform_equals_caffe_wide_rows(dtype, crop, meanmode):
    """Rows of 16+ values (the vectorised path) and their tails."""
    rng = np.random.default_rng(12)
    n, C, H, W = 3, 2, 35, 37
    data = rng.integers(0, 256, (n, C, H, W)).astype(dtype)
    if dtype == np.float32:
        data += rng.random(data.shape).astype(np.float32)
    mean = (rng.random((C, H, W)) * 255).astype(np.float32) if meanmode == "file" else None
    mv = None if mean is not None else [17.5, 200.25]
    for phase in ("train", "test"):
        t = ld.Transform(scale=0.0123, mean_file=mean, mean_value=mv, crop_size=crop,
                         mirror=True, phase=phase, seed=8)
        want = reference_batch(data, scale=0.0123, mean=mean, mean_values=mv,
                               crop_size=crop, mirror=True, phase=phase, seed=8)
        assert np.array_equal(t(data), want)


def test_transform_randomness_is_seeded_and_varies():
    data = np.arange(2 * 1 * 6 * 6, dtype=np.uint8).reshape(2, 1, 6, 6).repeat(50, axis=0)
    a = ld.Transform(crop_size=3, mirror=True, seed=7)
    b = ld.Transform(crop_size=3, mirror=True, seed=7)
    x1, x2 = a(data), a(data)
    assert np.array_equal(x1, b(data)) and np.array_equal(x2, b(data))
    assert not np.array_equal(x1, x2)
    # mirror happens about half the time, in TEST too (Caffe checks no phase)
    t = ld.Transform(mirror=True, phase="test", seed=1)
    d = np.arange(4, dtype=np.uint8).reshape(1, 1, 1, 4).repeat(400, axis=0)
    out = t(d)
    flipped = (out[:, 0, 0, 0] == 3).sum()
    assert 140 < flipped < 260
    # TEST crop is the centre, deterministic
    t = ld.Transform(crop_size=2, phase=1)
    img = np.arange(25, dtype=np.uint8).reshape(1, 1, 5, 5)
    assert t(img)[0, 0].tolist() == [[6, 7], [11, 12]]
    # an explicit Generator
    g1, g2 = np.random.default_rng(3), np.random.default_rng(3)
    assert np.array_equal(a(data, rng=g1), b(data, rng=g2))


def test_transform_errors(tmp_path):
    with pytest.raises(ValueError, match="same time"):
        ld.Transform(mean_file=np.zeros((1, 2, 2), np.float32), mean_value=[1.0])
    with pytest.raises(ValueError, match="crop_size"):
        ld.Transform(crop_size=5)(np.zeros((1, 1, 4, 8), np.uint8))
    with pytest.raises(ValueError, match="mean_value"):
        ld.Transform(mean_value=[1, 2])(np.zeros((1, 3, 4, 4), np.uint8))
    with pytest.raises(ValueError, match="must match"):
        ld.Transform(mean_file=np.zeros((3, 4, 4), np.float32))(np.zeros((1, 3, 5, 5), np.uint8))
    with pytest.raises(ValueError, match="phase"):
        ld.Transform(phase="val")
    t = ld.Transform(crop_size=2, scale=2.0)
    assert t(np.ones((3, 4, 4), np.uint8)).shape == (3, 2, 2)  # one datum
    assert t.output_shape((3, 32, 32)) == (3, 2, 2)
    assert "crop_size=2" in repr(t)


# ---------------------------------------------------------------------------
# DatumReader over an LMDB


@pytest.fixture
def cifar_like(tmp_path):
    rng = np.random.default_rng(5)
    imgs = rng.integers(0, 256, (300, 3, 8, 8), dtype=np.uint8)
    labels = rng.integers(-2, 10, 300)
    path = write_lmdb(tmp_path / "db", [ld.encode(imgs[i], int(labels[i])) for i in range(300)])
    return path, imgs, labels


def test_datum_reader_yields_everything_in_order(cifar_like):
    path, imgs, labels = cifar_like
    seen = []
    with lmdbio.DatumReader(path, batch_size=64) as r:
        assert len(r) == 5 and r.total_records == 300 and r.num_records == 300
        for data, lab in r:
            assert data.dtype == np.uint8 and data.shape[1:] == (3, 8, 8)
            seen.append((data, lab))
    data = np.concatenate([d for d, _ in seen])
    assert np.array_equal(data, imgs)
    assert np.concatenate([l for _, l in seen]).tolist() == labels.tolist()


@pytest.mark.parametrize("prefetch", [0, 3])
def test_datum_reader_shuffle_shard_transform(cifar_like, prefetch):
    path, imgs, labels = cifar_like
    t = ld.Transform(crop_size=6, mirror=True, mean_value=[100, 110, 120],
                     scale=0.5, seed=9)
    ref_t = ld.Transform(crop_size=6, mirror=True, mean_value=[100, 110, 120],
                         scale=0.5, seed=9)
    r = lmdbio.DatumReader(path, transform=t, batch_size=32, shuffle=True, seed=3,
                           rank=1, world_size=3, prefetch=prefetch)
    r.set_epoch(2)
    order = np.array(spec_shard(300, 3, 1, shuffle=True, seed=3, epoch=2))
    pos = 0
    for data, lab in r:
        n = len(lab)
        idx = order[pos:pos + n]
        assert data.dtype == np.float32 and data.shape == (n, 3, 6, 6)
        assert np.array_equal(data, ref_t(imgs[idx]))
        assert lab.tolist() == labels[idx].tolist()
        pos += n
    assert pos == len(order) == r.num_records
    d, l = r.read([5, 0])
    assert d.shape == (2, 3, 6, 6) and l.tolist() == labels[[5, 0]].tolist()
    r.close()


def test_datum_reader_early_exit_leaves_no_thread(cifar_like):
    path, _, _ = cifar_like
    before = {t.name for t in threading.enumerate()}
    r = lmdbio.DatumReader(path, batch_size=16)
    it = iter(r)
    next(it)
    it.close()
    r.close()
    after = [t for t in threading.enumerate() if t.name == "lmdbio-datum"]
    assert not after, (before, after)


def test_datum_reader_names_the_bad_record(tmp_path):
    vals = [ld.encode(np.zeros((1, 2, 2), np.uint8), i) for i in range(40)]
    vals[27] = vals[27][:-6]
    path = write_lmdb(tmp_path / "bad", vals)
    with lmdbio.DatumReader(path, batch_size=16) as r:
        with pytest.raises(lmdbio.DatumError, match=r"^record 27: malformed"):
            for _ in r:
                pass
    vals[27] = ld.encode(np.zeros((1, 2, 3), np.uint8), 0)
    path = write_lmdb(tmp_path / "odd", vals)
    with lmdbio.DatumReader(path, batch_size=16, prefetch=0) as r:
        with pytest.raises(ValueError, match=r"^record 27 has shape 1x2x3"):
            list(r)


def test_datum_reader_encoded(tmp_path, backend):
    imgs = [_bgr_image(i, (3, 10, 12)) for i in range(50)]
    path = write_lmdb(tmp_path / "enc", [ld.encode(im, i, encoded=True)
                                          for i, im in enumerate(imgs)])
    t = ld.Transform(force_gray=True)
    with lmdbio.DatumReader(path, batch_size=20, decode_threads=2) as r:
        got = np.concatenate([d for d, _ in r])
    assert np.array_equal(got, np.stack(imgs))
    with lmdbio.DatumReader(path, batch_size=20, transform=t) as r:
        d, _ = next(iter(r))
        assert d.shape == (20, 1, 10, 12) and d.dtype == np.float32


def test_lazy_exports():
    assert lmdbio.DatumReader is ld.DatumReader
    assert lmdbio.datum.DatumError is lmdbio.DatumError
    assert issubclass(lmdbio.DatumError, ValueError)


def test_readme_datum_example_runs_as_written(tmp_path):
    import re
    import subprocess
    import sys
    text = open(os.path.join(ROOT, "README.md")).read()
    m = re.search(r"<!-- test: datum-example -->\s*```python\n(.*?)```", text, re.S)
    if m is None:
        pytest.skip("README has no datum example block")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "s.npz", data=rng.integers(0, 256, (600, 3, 32, 32), dtype=np.uint8),
             labels=rng.integers(0, 10, 600))
    os.makedirs(tmp_path / "data")
    from lmdbio.cli import main
    assert main(["convert", "--npz", "-q", str(tmp_path / "s.npz"),
                 str(tmp_path / "data" / "demo_lmdb")]) == 0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(lmdbio.__file__))] +
        [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    r = subprocess.run([sys.executable, "-c", m.group(1)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


# ---------------------------------------------------------------------------
# differential fuzzing against protobuf: wire-type mismatches, repeated
# fields, unknown fields, truncations

def _pb_varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _pb_field(draw, field, wt):
    """One field of wire type wt with a payload of that type."""
    tag = _pb_varint(field << 3 | wt)
    if wt == 0:
        return tag + _pb_varint(draw(st.sampled_from(
            [0, 1, 2, 3, 7, 255, 2 ** 31 - 1, -1, -2 ** 31, 2 ** 40])))
    if wt == 1:
        return tag + draw(st.binary(min_size=8, max_size=8))
    if wt == 5:
        return tag + draw(st.binary(min_size=4, max_size=4))
    if wt == 2:
        n = draw(st.sampled_from([0, 1, 3, 4, 8, 12]))
        return tag + _pb_varint(n) + draw(st.binary(min_size=n, max_size=n))
    # a group holding one varint field, closed by its own end tag
    inner = _pb_varint(1 << 3) + _pb_varint(draw(st.integers(0, 300)))
    return tag + inner + _pb_varint(field << 3 | 4)


@st.composite
def fuzzed_datum(draw):
    """(bytes, has_group): a consistent Datum with extra fields inserted
    anywhere (known numbers with any wire type, repeats, unknown numbers),
    sometimes truncated or with a byte changed."""
    c, h, w = (draw(st.integers(0, 3)) for _ in range(3))
    floats = draw(st.booleans())
    # one part per field, each serialized by protobuf, in a drawn order
    parts = [Datum(channels=c).SerializeToString(),
             Datum(height=h).SerializeToString(),
             Datum(width=w).SerializeToString(),
             Datum(label=draw(st.integers(-3, 3))).SerializeToString()]
    if floats:
        parts += [Datum(float_data=[float(i) - 2.5]).SerializeToString()
                  for i in range(c * h * w)]
    else:
        parts.append(Datum(data=bytes(range(c * h * w))).SerializeToString())
    parts = draw(st.permutations(parts))
    has_group = False
    for _ in range(draw(st.integers(0, 4))):
        field = draw(st.sampled_from([1, 2, 3, 4, 5, 6, 7, 8, 15, 16, 2047]))
        wt = draw(st.sampled_from([0, 1, 2, 5, 3] if draw(st.booleans())
                                  else [0, 1, 2, 5]))
        has_group |= wt == 3
        parts.insert(draw(st.integers(0, len(parts))), _pb_field(draw, field, wt))
    raw = bytearray(b"".join(parts))
    if raw and draw(st.integers(0, 3)) == 0:
        raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
    if draw(st.integers(0, 3)) == 0:
        raw = raw[:draw(st.integers(0, len(raw)))]
    return bytes(raw), has_group


def caffe_view(m):
    """What a Datum decoder returns for protobuf Datum m (raw or float_data
    only), or None where the sizes disagree with the content."""
    if m.encoded:
        return None  # not an image: must be refused
    c, h, w = m.channels, m.height, m.width
    if min(c, h, w) < 0:
        return None
    if m.data:
        if len(m.data) != c * h * w:
            return None
        return np.frombuffer(m.data, np.uint8).reshape(c, h, w)
    if len(m.float_data):
        if len(m.float_data) != c * h * w:
            return None
        return np.array(m.float_data, np.float32).reshape(c, h, w)
    if c * h * w:
        return None
    return np.zeros((c, h, w), np.uint8)


@given(fuzzed_datum())
@settings(max_examples=3000, deadline=None)
def test_differential_against_protobuf(case):
    """lmdbio decodes exactly what protobuf parses into a consistent Datum
    and refuses the rest.  Groups are the documented exception: there
    lmdbio may refuse what protobuf skips, but never decode differently."""
    raw, has_group = case
    try:
        ref = parse_datum(raw)
    except Exception:
        ref = None
    want = None if ref is None else caffe_view(ref)
    try:
        arr, lab = ld.decode_one(raw)
    except lmdbio.DatumError:
        assert want is None or has_group, (
            "lmdbio refused %r, protobuf reads it as %r" % (raw, ref))
        return
    assert want is not None, "lmdbio decoded %r, protobuf: %r" % (raw, ref)
    assert lab == ref.label
    # bit for bit: float_data may hold NaNs, which never equal themselves
    assert arr.dtype == want.dtype and arr.shape == want.shape
    assert arr.tobytes() == want.tobytes()
    # the batch decoder agrees with the one-record decoder
    batch, labels = ld.decode([raw, raw])
    assert batch[1].shape == want.shape and batch[1].tobytes() == want.tobytes()
    assert list(labels) == [lab, lab]


@pytest.mark.parametrize("extra", [
    b"\x25\x01\x02\x03\x04",            # data (4) as fixed32
    b"\x20\x05",                        # data as varint
    b"\x0a\x01\x07",                    # channels (1) as bytes
    b"\x2d\x01\x00\x00\x00",            # label (5) as fixed32
    b"\x30\x01",                        # float_data (6) as varint
    b"\x39" + b"\x00" * 8,              # encoded (7) as fixed64
    b"\x23\x08\x01\x24",                # data (4) as a group
])
def test_known_field_with_another_wire_type_is_an_unknown_field(extra):
    for raw in (GOOD + extra, extra + GOOD):
        ref = parse_datum(raw)
        arr, lab = ld.decode_one(raw)
        assert lab == ref.label == 3
        assert np.array_equal(arr, pixels(ref))
        assert np.array_equal(arr, np.frombuffer(b"abcd", np.uint8).reshape(1, 2, 2))


# ---------------------------------------------------------------------------
# colour order: color="rgb" is the channel reversal of the BGR Caffe stores

def _rgb_of(bgr):
    """The reference: B, G, R(, A) -> R, G, B(, A) along the channel axis."""
    order = [2, 1, 0, 3][:bgr.shape[-3]] if bgr.shape[-3] in (3, 4) else [0]
    return np.take(bgr, order, axis=-3)


@pytest.mark.parametrize("floats", [False, True])
@pytest.mark.parametrize("c", [1, 3, 4])
def test_rgb_is_the_channel_reversal_of_bgr(c, floats):
    msgs = [pb((c, 5, 6), label=i, seed=i, floats=floats) for i in range(7)]
    raws = [m.SerializeToString() for m in msgs]
    bgr, lab = ld.decode(raws)
    rgb, lab2 = ld.decode(raws, color="rgb")
    assert np.array_equal(lab, lab2)
    assert rgb.dtype == bgr.dtype and np.array_equal(rgb, _rgb_of(bgr))
    if c == 3:
        assert np.array_equal(rgb, bgr[:, ::-1])
    assert np.array_equal(ld.decode(raws, color="bgr")[0], bgr)
    out = np.empty_like(bgr)
    assert ld.decode(raws, color="rgb", out=out)[0] is out
    assert np.array_equal(out, rgb)
    for i, raw in enumerate(raws):
        one_bgr, _ = ld.decode_one(raw)
        one_rgb, label = ld.decode_one(raw, color="rgb")
        assert label == i and np.array_equal(one_rgb, _rgb_of(one_bgr))
        assert np.array_equal(one_rgb, rgb[i])


def test_rgb_of_encoded_images(backend):
    rng = np.random.default_rng(2)
    imgs = rng.integers(0, 256, (4, 3, 9, 7), dtype=np.uint8)
    raws = [ld.encode(im, 1, encoded="png") for im in imgs]
    bgr, _ = ld.decode(raws)
    assert np.array_equal(bgr, imgs)  # png is lossless
    rgb, _ = ld.decode(raws, color="rgb")
    assert np.array_equal(rgb, imgs[:, ::-1])
    assert np.array_equal(ld.decode_one(raws[2], color="rgb")[0], imgs[2, ::-1])


def test_color_is_checked():
    for bad in ("RGB", "bgra", None, 1):
        with pytest.raises(ValueError, match="color"):
            ld.decode([GOOD], color=bad)
        with pytest.raises(ValueError, match="color"):
            ld.decode_one(GOOD, color=bad)
    two = pb((2, 3, 3)).SerializeToString()
    with pytest.raises(ValueError, match="channels"):
        ld.decode([two], color="rgb")
    assert ld.decode([two])[0].shape == (1, 2, 3, 3)


def test_datum_reader_rgb(cifar_like):
    path, imgs, labels = cifar_like
    with lmdbio.DatumReader(path, batch_size=100, color="rgb") as r:
        got = np.concatenate([d for d, _ in r])
    assert np.array_equal(got, imgs[:, ::-1])
    with pytest.raises(ValueError, match="color"):
        lmdbio.DatumReader(path, color="hsv")


def test_torch_datasets_rgb(cifar_like):
    try:
        import lmdbio.torch as lt
    except ImportError:
        if require_lmdbio():
            raise
        pytest.skip("PyTorch is not installed")
    path, imgs, labels = cifar_like
    ds = lt.LMDBDataset(path, decode=ld.decode_one, color="rgb")
    arr, label = ds[7]
    assert np.array_equal(arr, imgs[7, ::-1]) and label == labels[7]
    it = lt.LMDBIterableDataset(path, batch_size=50, decode=ld.decode,
                                color="rgb")
    got = np.concatenate([d for d, _ in it])
    assert np.array_equal(got, imgs[:, ::-1])
    with pytest.raises(ValueError, match="decode"):
        lt.LMDBDataset(path, color="rgb")
