"""`lmdbio convert`: a folder of images + list file (Caffe's convert_imageset)
and .npz arrays into an LMDB of Datums, checked by reading the result back
with py-lmdb and protobuf (caffe_pb) and with lmdbio.datum."""

from __future__ import annotations

import importlib.util
import io
import os
import subprocess
import sys

import lmdb
import numpy as np
import pytest

from caffe_pb import parse_datum
from conftest import require_lmdbio

try:
    import lmdbio
    from lmdbio import cli
    from lmdbio import datum as ld
except Exception as exc:  # pragma: no cover - a broken build
    if require_lmdbio():
        raise
    pytest.skip("lmdbio cannot be imported: %r" % (exc,), allow_module_level=True)

HAVE_CV2 = importlib.util.find_spec("cv2") is not None
HAVE_IMAGES = HAVE_CV2 or importlib.util.find_spec("PIL") is not None
needs_images = pytest.mark.skipif(not HAVE_IMAGES, reason="needs OpenCV or Pillow")


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def run(args):
    out, err = io.BytesIO(), io.BytesIO()
    rc = cli.main(["convert"] + [str(a) for a in args], stdout=out, stderr=err)
    return rc, err.getvalue().decode()


def items(path):
    env = lmdb.open(str(path), readonly=True, lock=False)
    with env.begin() as txn:
        got = [(bytes(k), bytes(v)) for k, v in txn.cursor()]
    env.close()
    return got


@pytest.fixture
def imageset(tmp_path):
    """PNG images (BGR pixels known), one JPEG, a list file."""
    root = tmp_path / "images"
    (root / "sub dir").mkdir(parents=True)
    rng = np.random.default_rng(0)
    entries = []
    for i in range(12):
        shape = (3, 6 + i % 3, 7)
        px = rng.integers(0, 256, shape, dtype=np.uint8)
        name = ("sub dir/img %d.png" if i % 4 == 0 else "img%02d.png") % i
        (root / name).write_bytes(ld._png(px))
        entries.append((name, i % 5 - 1, px))
    lst = tmp_path / "list.txt"
    lst.write_text("".join("%s %d\n" % (n, l) for n, l, _ in entries) + "\n")
    return root, lst, entries


@needs_images
def test_imageset_raw_round_trip(tmp_path, imageset):
    root, lst, entries = imageset
    rc, err = run([str(root) + "/", lst, tmp_path / "db"])
    assert rc == 0, err
    got = items(tmp_path / "db")
    assert [k for k, _ in got] == [b"%08d_%s" % (i, n.encode()) for i, (n, _, _) in
                                   enumerate(entries)]
    for (k, v), (name, label, px) in zip(got, entries):
        m = parse_datum(v)
        assert (m.channels, m.height, m.width) == px.shape and m.label == label
        assert not m.encoded and m.data == px.tobytes()
        arr, lab = ld.decode_one(v)
        assert np.array_equal(arr, px) and lab == label
    assert "A total of 12 images" in err


@needs_images
def test_imageset_gray_resize_shuffle(tmp_path, imageset):
    root, lst, entries = imageset
    rc, err = run(["--gray", "--resize_height", 5, "--resize-width", 4, "--shuffle",
                   "--seed", 3, "--check_size", root, lst, tmp_path / "db"])
    assert rc == 0, err
    got = items(tmp_path / "db")
    perm = np.random.default_rng(3).permutation(len(entries))
    keys = sorted(b"%08d_%s" % (i, entries[j][0].encode()) for i, j in enumerate(perm))
    assert [k for k, _ in got] == keys
    data, labels = ld.decode([v for _, v in got])
    assert data.shape == (12, 1, 5, 4)
    assert labels.tolist() == [entries[j][1] for j in perm]
    if HAVE_CV2 and ld.image_backend() == "cv2":
        import cv2
        _, _, px = entries[perm[0]]
        grey = cv2.cvtColor(px.transpose(1, 2, 0).copy(), cv2.COLOR_BGR2GRAY)
        want = cv2.resize(grey, (4, 5), interpolation=cv2.INTER_LINEAR)
        assert np.abs(data[0, 0].astype(int) - want).max() <= 1


@needs_images
def test_imageset_encoded_keeps_the_files(tmp_path, imageset):
    root, lst, entries = imageset
    rc, err = run(["--encoded", root, lst, tmp_path / "db"])
    assert rc == 0, err
    got = items(tmp_path / "db")
    for (k, v), (name, label, px) in zip(got, entries):
        m = parse_datum(v)
        assert m.encoded and m.label == label and m.channels == 0
        assert m.data == (root / name).read_bytes()  # the file itself
    data, labels = ld.decode([got[i][1] for i in (3, 6, 9)])  # all 3x6x7
    assert np.array_equal(data, np.stack([entries[i][2] for i in (3, 6, 9)]))
    # --encode_type jpg re-encodes PNG files as JPEG (and implies --encoded)
    rc, err = run(["--encode_type", "jpg", root, lst, tmp_path / "db2"])
    assert rc == 0, err
    for k, v in items(tmp_path / "db2"):
        m = parse_datum(v)
        assert m.encoded and m.data[:2] == b"\xff\xd8"
    # resized: re-encoded as the file's type
    rc, err = run(["--encoded", "--resize_height", 4, "--resize_width", 4, root, lst,
                   tmp_path / "db3"])
    assert rc == 0, err
    data, _ = ld.decode([v for _, v in items(tmp_path / "db3")])
    assert data.shape == (12, 3, 4, 4)


@needs_images
def test_imageset_skips_unreadable_and_checks_size(tmp_path, imageset):
    root, lst, entries = imageset
    (root / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    lst2 = tmp_path / "list2.txt"
    lst2.write_text(lst.read_text() + "broken.png 3\nmissing.jpg 1\n")
    rc, err = run([root, lst2, tmp_path / "db"])
    assert rc == 0, err
    assert "broken.png" in err and "missing.jpg" in err and "2 unreadable" in err
    assert len(items(tmp_path / "db")) == 12
    rc, err = run(["--check_size", root, lst, tmp_path / "db4"])
    assert rc == 1 and "Incorrect data field size" in err and "line 2" in err


def test_usage_errors(tmp_path, imageset):
    root, lst, _ = imageset
    bad = tmp_path / "bad.txt"
    bad.write_text("noLabelHere\n")
    rc, err = run([root, bad, tmp_path / "x"])
    assert rc == 1 and "bad.txt:1" in err
    bad.write_text("a.png one\n")
    rc, err = run([root, bad, tmp_path / "y"])
    assert rc == 1 and "not an integer" in err
    rc, err = run([root, lst])
    assert rc == 2 and "usage" in err
    rc, err = run(["--frobnicate", root, lst, tmp_path / "z"])
    assert rc == 2
    (tmp_path / "exists").mkdir()
    (tmp_path / "exists" / "f").write_text("x")
    rc, err = run([root, lst, tmp_path / "exists"])
    assert rc == 1 and "already exists" in err
    rc, err = run(["--encode_type", "gif", root, lst, tmp_path / "w"])
    assert rc == 1 and "png or jpg" in err


def test_npz_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, (250, 3, 8, 9), dtype=np.uint8)
    labels = rng.integers(-3, 10, 250)
    np.savez(tmp_path / "a.npz", data=data, labels=labels)
    rc, err = run(["--npz", "--commit-every", 64, tmp_path / "a.npz", tmp_path / "db"])
    assert rc == 0, err
    got = items(tmp_path / "db")
    assert [k for k, _ in got] == [b"%08d" % i for i in range(250)]
    assert got[5][1] == ld.encode(data[5], int(labels[5]))
    with lmdbio.DatumReader(str(tmp_path / "db"), batch_size=100) as r:
        d = np.concatenate([x for x, _ in r])
    assert np.array_equal(d, data)


def test_npz_layouts_floats_and_encoded(tmp_path):
    rng = np.random.default_rng(2)
    rgb_hwc = rng.integers(0, 256, (20, 5, 6, 3), dtype=np.uint8)
    np.savez(tmp_path / "b.npz", x=rgb_hwc, y=np.arange(20))
    rc, err = run(["--npz", "--nhwc", "--rgb", "--encoded", "--shuffle",
                   tmp_path / "b.npz", tmp_path / "db"])
    assert rc == 0, err
    d, l = ld.decode([v for _, v in items(tmp_path / "db")])
    perm = np.random.default_rng(0).permutation(20)
    assert l.tolist() == perm.tolist()
    assert np.array_equal(d, rgb_hwc[perm][..., ::-1].transpose(0, 3, 1, 2))
    assert parse_datum(items(tmp_path / "db")[0][1]).encoded
    # float arrays -> float_data Datums; grey [N, H, W]; no labels
    f = rng.standard_normal((7, 4, 4)).astype(np.float32)
    np.savez(tmp_path / "c.npz", images=f)
    rc, err = run(["--npz", tmp_path / "c.npz", tmp_path / "db2"])
    assert rc == 0, err
    d, l = ld.decode([v for _, v in items(tmp_path / "db2")])
    assert d.dtype == np.float32 and np.array_equal(d[:, 0], f) and not l.any()
    # errors
    np.savez(tmp_path / "d.npz", foo=f)
    rc, err = run(["--npz", tmp_path / "d.npz", tmp_path / "db3"])
    assert rc == 1 and "--data-key" in err
    np.savez(tmp_path / "e.npz", data=rgb_hwc, labels=np.arange(3))
    rc, err = run(["--npz", tmp_path / "e.npz", tmp_path / "db4"])
    assert rc == 1 and "20 images but 3 labels" in err
    rc, err = run(["--npz", "--label-key", "nope", tmp_path / "b.npz", tmp_path / "db5"])
    assert rc == 1 and "nope" in err


def test_python_dash_m_entry_point(tmp_path):
    np.savez(tmp_path / "a.npz", data=np.zeros((3, 1, 2, 2), np.uint8), labels=[1, 2, 3])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(lmdbio.__file__))] +
        [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    r = subprocess.run([sys.executable, "-m", "lmdbio", "convert", "--npz", "-q",
                        str(tmp_path / "a.npz"), str(tmp_path / "db")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [ld.decode_one(v)[1] for _, v in items(tmp_path / "db")] == [1, 2, 3]
    r = subprocess.run([sys.executable, "-m", "lmdbio", "convert", "--help"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and "convert_imageset" in r.stdout
