"""lmdbio.caffe.DataLayer driven the way pycaffe drives a Python layer.

pycaffe is not installable here: `Blob` below follows pycaffe's Blob
interface (``data`` a float32 array, ``reshape(*shape)``, ``shape``) and
`run_layer` follows Caffe's sequence (PythonLayer::LayerSetUp sets
``param_str`` and ``phase`` then calls ``setup``; Layer::SetUp then calls
``reshape``; every Net::Forward calls ``reshape`` then ``forward``).  A fake
``caffe`` module checks that the layer subclasses ``caffe.Layer`` when pycaffe
is importable and takes rank and size from ``caffe.solver_rank()`` /
``solver_count()``.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import types

import lmdb
import numpy as np
import pytest

from caffe_pb import BlobProto
from conftest import require_lmdbio, spec_shard

try:
    import lmdbio
    from lmdbio import datum as ld
    import lmdbio.caffe as lc
except Exception as exc:  # pragma: no cover - a broken build
    if require_lmdbio():
        raise
    pytest.skip("lmdbio cannot be imported: %r" % (exc,), allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN, TEST = 0, 1


class Blob:
    """pycaffe's Blob as a Python layer sees it."""

    def __init__(self):
        self._data = np.zeros((0,), dtype=np.float32)

    @property
    def data(self):
        return self._data

    @property
    def shape(self):
        return self._data.shape

    @property
    def count(self):
        return self._data.size

    def reshape(self, *shape):
        shape = tuple(int(s) for s in shape)
        if shape != self._data.shape:
            self._data = np.zeros(shape, dtype=np.float32)


class Layer:
    """Stand-in for pycaffe's caffe.Layer (what a fake caffe module offers):
    constructed with the LayerParameter, as boost.python's is."""

    def __init__(self, param):
        self.layer_param = param


class CaffeDriver:
    """Caffe's calls to a Python layer, in Caffe's order."""

    def __init__(self, cls, param_str, phase, ntop=2):
        # PythonLayer: `module.attr(layer)(layer_param)`, then LayerSetUp
        self.layer = cls(types.SimpleNamespace(python_param=types.SimpleNamespace(
            param_str=param_str)))
        self.layer.param_str = param_str
        self.layer.phase = phase
        self.bottom = []
        self.top = [Blob() for _ in range(ntop)]
        self.layer.setup(self.bottom, self.top)   # LayerSetUp
        self.layer.reshape(self.bottom, self.top)  # Layer::SetUp -> Reshape

    def forward(self):
        self.layer.reshape(self.bottom, self.top)
        self.layer.forward(self.bottom, self.top)
        return [t.data.copy() for t in self.top]

    def backward(self):
        self.layer.backward(self.top, [False] * len(self.top), self.bottom)


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    for var in ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
                "PMIX_RANK", "PMIX_SIZE", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def db(tmp_path):
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, (50, 3, 10, 12), dtype=np.uint8)
    labels = rng.integers(0, 10, 50)
    env = lmdb.open(str(tmp_path / "train_lmdb"), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i in range(50):
            txn.put(b"%08d" % i, ld.encode(imgs[i], int(labels[i])))
    env.close()
    return str(tmp_path / "train_lmdb"), imgs, labels


def expected_stream(imgs, labels, order_fn, batch, nbatches):
    """Records of consecutive batches, wrapping epochs like Caffe."""
    out, epoch, pos = [], 0, 0
    order = order_fn(epoch)
    for _ in range(nbatches):
        idx = []
        while len(idx) < batch:
            if pos == len(order):
                epoch += 1
                order, pos = order_fn(epoch), 0
            take = order[pos:pos + batch - len(idx)]
            idx.extend(take.tolist())
            pos += len(take)
        out.append(np.array(idx))
    return out


def test_layer_train_phase_transforms_like_caffe(db, tmp_path):
    path, imgs, labels = db
    mean = (np.random.default_rng(1).random((3, 10, 12)) * 255).astype(np.float32)
    b = BlobProto(num=1, channels=3, height=10, width=12)
    b.data.extend(mean.ravel().tolist())
    (tmp_path / "mean.binaryproto").write_bytes(b.SerializeToString())
    params = {"source": path, "batch_size": 16, "transform_param": {
        "crop_size": 8, "mirror": True, "mean_file": str(tmp_path / "mean.binaryproto"),
        "scale": 0.5}}
    import json
    d = CaffeDriver(lc.DataLayer, json.dumps(params), TRAIN)
    assert d.top[0].shape == (16, 3, 8, 8) and d.top[1].shape == (16,)
    ref_t = ld.Transform(crop_size=8, mirror=True, mean_file=str(tmp_path / "mean.binaryproto"),
                         scale=0.5, seed=[0, 0])
    batches = expected_stream(imgs, labels, lambda e: np.arange(50), 16, 8)
    for idx in batches:  # 8 x 16 = 128 records: wraps the 50 twice
        data, lab = d.forward()
        assert np.array_equal(lab, labels[idx].astype(np.float32))
        assert np.array_equal(data, ref_t(imgs[idx]))
    d.backward()
    d.layer.close()


def test_layer_test_phase_is_center_crop_and_reads_everything(db, monkeypatch):
    path, imgs, labels = db
    fake = types.SimpleNamespace(solver_count=lambda: 4, solver_rank=lambda: 3, TRAIN=0, TEST=1)
    monkeypatch.setitem(sys.modules, "caffe", fake)
    d = CaffeDriver(lc.DataLayer, repr({"source": path, "batch_size": 25, "crop_size": 6,
                                        "mean_value": [1, 2, 3]}), TEST)
    assert (d.layer.rank, d.layer.world_size) == (0, 1)
    t = ld.Transform(crop_size=6, mean_value=[1, 2, 3], phase="test")
    for k in range(3):
        data, lab = d.forward()
        idx = np.arange(25) + 25 * (k % 2)
        assert np.array_equal(data, t(imgs[idx]))
        assert np.array_equal(lab, labels[idx])
    d.layer.close()


def test_layer_rank_from_pycaffe_solver(db, monkeypatch):
    path, imgs, labels = db
    fake = types.SimpleNamespace(solver_count=lambda: 2, solver_rank=lambda: 1)
    monkeypatch.setitem(sys.modules, "caffe", fake)
    assert lc.solver_rank_size() == (1, 2)
    d = CaffeDriver(lc.DataLayer, '{"source": "%s", "batch_size": 5}' % path, TRAIN)
    assert (d.layer.rank, d.layer.world_size) == (1, 2)
    data, lab = d.forward()
    assert np.array_equal(lab, labels[25:30])  # rank 1's half starts at 25
    assert np.array_equal(data, imgs[25:30].astype(np.float32))
    d.layer.close()


def test_rank_from_mpi_launcher(monkeypatch):
    monkeypatch.delitem(sys.modules, "caffe", raising=False)
    monkeypatch.setattr(lc, "_caffe", None)
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    assert lc.solver_rank_size() == (0, 1)
    monkeypatch.setenv("PMI_RANK", "2")
    monkeypatch.setenv("PMI_SIZE", "3")
    assert lc.solver_rank_size() == (2, 3)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    assert lc.solver_rank_size() == (1, 4)
    # an initialised mpi4py wins over the environment
    comm = types.SimpleNamespace(Get_rank=lambda: 5, Get_size=lambda: 6)
    mpi = types.SimpleNamespace(Is_initialized=lambda: True, Is_finalized=lambda: False,
                                COMM_WORLD=comm)
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", mpi)
    assert lc.solver_rank_size() == (5, 6)
    # pycaffe with a single solver defers to MPI
    monkeypatch.setitem(sys.modules, "caffe", types.SimpleNamespace(
        solver_count=lambda: 1, solver_rank=lambda: 0))
    assert lc.solver_rank_size() == (5, 6)


def test_layer_explicit_rank_shuffle_and_single_top(db):
    path, imgs, labels = db
    d = CaffeDriver(lc.DataLayer, str({"source": path, "batch_size": 7, "shuffle": True,
                                       "seed": 5, "rank": 2, "world_size": 3}),
                    TRAIN, ntop=1)
    batches = expected_stream(imgs, labels,
                              lambda e: np.array(spec_shard(50, 3, 2, True, 5, e)),
                              7, 6)
    for idx in batches:
        (data,) = d.forward()
        assert np.array_equal(data, imgs[idx].astype(np.float32))
    d.layer.close()


def test_subclasses_caffe_layer_when_pycaffe_is_importable(monkeypatch):
    fake = types.ModuleType("caffe")
    fake.Layer = Layer
    fake.TRAIN, fake.TEST = 0, 1
    monkeypatch.setitem(sys.modules, "caffe", fake)
    mod = importlib.reload(lc)
    try:
        assert issubclass(mod.DataLayer, Layer)
        layer = mod.DataLayer("the LayerParameter")
        assert layer.layer_param == "the LayerParameter"
    finally:
        monkeypatch.delitem(sys.modules, "caffe")
        mod = importlib.reload(lc)
    assert mod.DataLayer.__bases__ == (object,)


@pytest.mark.parametrize("text, match", [
    ("", "empty"),
    ("   ", "empty"),
    ("{source: x}", "neither JSON"),
    ("__import__('os').system('true')", "neither JSON"),
    ("[1, 2]", "must be a dict"),
    ('{"batch_size": 4}', '"source"'),
    ('{"source": "x"}', '"batch_size"'),
    ('{"source": "x", "batch_size": 0}', "at least 1"),
    ('{"source": "x", "batch_size": "64"}', "integer"),
    ('{"source": "x", "batch_size": 4, "crop": 3}', "unknown field"),
    ('{"source": "x", "batch_size": 4, "transform_param": {"batch_size": 3}}',
     "unknown transform_param"),
    ('{"source": "x", "batch_size": 4, "mirror": true, "transform_param": {"mirror": false}}',
     "twice"),
    ('{"source": "x", "batch_size": 4, "backend": "LEVELDB"}', "LMDB"),
    ('{"source": "x", "batch_size": 4, "mean_file": "m", "mean_value": [1]}', "same time"),
    ('{"source": "x", "batch_size": 4, "mean_value": ["a"]}', "mean_value"),
    ('{"source": "x", "batch_size": 4, "rank": 1}', "go together"),
    ('{"source": "x", "batch_size": 4, "rank": 3, "world_size": 2}', "rank"),
    ('{"source": "x", "batch_size": 4, "force_color": true, "force_gray": true}', "both"),
])
def test_bad_param_str_is_a_clear_error_at_setup(text, match):
    with pytest.raises(ValueError, match=match) as ei:
        CaffeDriver(lc.DataLayer, text, TRAIN)
    assert "param_str" in str(ei.value)


def test_param_str_forms():
    a = lc.parse_param_str('{"source": "s", "batch_size": 4, "transform_param": '
                           '{"mirror": true, "mean_value": [104, 117, 123]}}')
    b = lc.parse_param_str("{'source': 's', 'batch_size': 4, 'mirror': True, "
                           "'mean_value': (104, 117, 123)}")
    c = lc.parse_param_str('{"data_param": {"source": "s", "batch_size": 4, "backend": "LMDB"},'
                           ' "transform_param": {"mirror": 1, "mean_value": [104, 117, 123]}}')
    for p in (a, b, c):
        assert p["source"] == "s" and p["batch_size"] == 4 and p["mirror"]
        assert p["mean_value"] == [104.0, 117.0, 123.0]
    assert lc.parse_param_str(b'{"source": "s", "batch_size": 1, "mean_value": 3}')["mean_value"] == [3.0]


def test_setup_errors(tmp_path, db):
    with pytest.raises(ValueError, match="not an LMDB directory"):
        CaffeDriver(lc.DataLayer, '{"source": "%s", "batch_size": 4}' % (tmp_path / "nope"), TRAIN)
    layer = lc.DataLayer(None)
    layer.param_str = '{"source": "%s", "batch_size": 4}' % db[0]
    layer.phase = TRAIN
    with pytest.raises(ValueError, match="bottom"):
        layer.setup([Blob()], [Blob(), Blob()])
    with pytest.raises(ValueError, match="tops"):
        layer.setup([], [Blob(), Blob(), Blob()])


def _prototxt_params(path):
    text = open(path).read()
    return re.findall(r"param_str:\s*'([^']*)'", text)


def test_example_prototxt_runs(tmp_path, db):
    """examples/lmdbio_train_val.prototxt's layers, with their own
    param_str (paths redirected to a small database)."""
    proto = os.path.join(ROOT, "examples", "lmdbio_train_val.prototxt")
    if not os.path.exists(proto):
        pytest.skip("examples/ not in this tree")
    import json
    params = _prototxt_params(proto)
    assert len(params) == 2
    text = open(proto).read()
    assert 'module: "lmdbio.caffe"' in text and 'layer: "DataLayer"' in text
    # the example's mean file, at the database's size
    b = BlobProto(num=1, channels=3, height=10, width=12)
    b.data.extend([100.0] * 360)
    (tmp_path / "mean.binaryproto").write_bytes(b.SerializeToString())
    for phase, p in zip((TRAIN, TEST), params):
        d = json.loads(p)
        d["source"] = db[0]
        tp = d.get("transform_param", d)
        if "mean_file" in tp:
            tp["mean_file"] = str(tmp_path / "mean.binaryproto")
        if "crop_size" in tp:
            tp["crop_size"] = 8
        drv = CaffeDriver(lc.DataLayer, json.dumps(d), phase)
        data, label = drv.forward()
        assert data.shape[0] == d.get("batch_size", d.get("data_param", {}).get("batch_size"))
        drv.layer.close()
