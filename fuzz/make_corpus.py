"""Write the seed corpora of the fuzz targets (committed; rerun to refresh):

    .venv/bin/python fuzz/make_corpus.py

corpus/lmdb: small real LMDB data files (4 KiB pages, 3 to 16 pages each),
written by py-lmdb and by mdb_load, covering every page and node kind the
parser knows: leaves, branches (depth 2 and 3), overflow runs, named DBs,
DUPSORT sub-pages and sub-trees, DUPFIXED (LEAF2) sub-pages and sub-trees,
INTEGERKEY, REVERSEKEY, free-DB records, an empty environment.
corpus/datum: serialized Caffe Datums and BlobProtos (raw, float, encoded,
packed and unpacked floats, unknown fields).
"""

import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import lmdb  # noqa: E402

OUT = os.path.join(HERE, "corpus", "lmdb")
DOUT = os.path.join(HERE, "corpus", "datum")
MAX_FILE = 96 << 10


def env_file(name, fill, max_dbs=8, **kw):
    d = tempfile.mkdtemp()
    try:
        env = lmdb.open(d, max_dbs=max_dbs, map_size=16 << 20, **kw)
        fill(env)
        env.close()
        data = open(os.path.join(d, "data.mdb"), "rb").read()
    finally:
        shutil.rmtree(d)
    assert len(data) <= MAX_FILE, (name, len(data))
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


def put_all(db_name=None, items=(), **flags):
    def fill(env):
        db = env.open_db(db_name.encode(), **flags) if db_name else None
        with env.begin(write=True, db=db) as txn:
            for k, v in items:
                txn.put(k, v)
    return fill


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    shutil.rmtree(DOUT, ignore_errors=True)
    os.makedirs(OUT)
    os.makedirs(DOUT)

    env_file("empty", lambda env: None)
    env_file("one_leaf", put_all(items=[(b"k%02d" % i, b"v" * i) for i in range(30)]))
    env_file("depth2", put_all(items=[(b"key%04d" % i, b"x" * 40) for i in range(200)]))
    # few records per leaf, an overflow value among them: a record map
    env_file("record_map", put_all(items=[(b"r%03d" % i, (b"%03d|" % i) * (
        2500 if i == 7 else 150 + 10 * i)) for i in range(24)]))
    env_file("depth3", put_all(items=[((b"%03d" % i) * 166, b"") for i in range(100)]))
    env_file("overflow", put_all(items=[(b"a", b"A" * 9000), (b"b", b"small"),
                                        (b"c", bytes(range(256)) * 20)]))
    env_file("integerkey", put_all("ints", [(struct.pack("=I", i * 7919), b"%d" % i)
                                            for i in range(150)], integerkey=True))
    env_file("integerkey8", put_all("ints8", [(struct.pack("=Q", i << 33), b"v")
                                              for i in range(40)], integerkey=True))
    env_file("reversekey", put_all("rev", [(b"%05d" % (i * 37), b"r") for i in range(150)],
                                   reverse_key=True))
    env_file("dupsort_subpages", put_all("dups", [(b"k%d" % (i % 7), b"dup%03d" % i)
                                                  for i in range(60)], dupsort=True))
    env_file("dupsort_subtree", put_all("dups", [(b"big", b"value-%05d" % i)
                                                 for i in range(500)]
                                        + [(b"small", b"x")], dupsort=True))
    env_file("dupfixed_subpages", put_all("fixed", [(b"k%d" % (i % 5), struct.pack("=I", i))
                                                    for i in range(50)],
                                          dupsort=True, dupfixed=True))
    env_file("dupfixed_subtree", put_all("fixed", [(b"k", struct.pack("=Q", i * 3))
                                                   for i in range(700)],
                                         dupsort=True, dupfixed=True, integerdup=True))

    def named(env):
        for n in (b"alpha", b"beta", b"gamma"):
            db = env.open_db(n)
            with env.begin(write=True, db=db) as txn:
                for i in range(20):
                    txn.put(b"%s-%d" % (n, i), b"v%d" % i)
        with env.begin(write=True) as txn:
            txn.put(b"zz-main", b"main value")
    env_file("named", named)

    def churn(env):
        for t in range(12):
            with env.begin(write=True) as txn:
                for i in range(40):
                    txn.put(b"k%03d" % ((i * 7 + t) % 90), b"t%d" % t * (i % 9 + 1))
                for i in range(0, 90, 5 + t % 3):
                    txn.delete(b"k%03d" % i)
    env_file("freedb_records", churn)

    # mdb_load: a REVERSEDUP database and a main DB with INTEGERKEY
    if shutil.which("mdb_load"):
        for name, header, recs in [
            ("mdb_load_reversedup", "dupsort=1\nreversedup=1\n",
             [(b"k%d" % (i % 3), b"%03d-dup" % i) for i in range(40)]),
            ("mdb_load_main_integerkey", "integerkey=1\n",
             [(struct.pack("=I", i * 3), b"val%d" % i) for i in range(60)]),
        ]:
            d = tempfile.mkdtemp()
            text = "VERSION=3\nformat=bytevalue\ntype=btree\n" + header + "HEADER=END\n"
            for k, v in recs:
                text += " " + k.hex() + "\n " + v.hex() + "\n"
            text += "DATA=END\n"
            subprocess.run(["mdb_load", d], input=text.encode(), check=True)
            data = open(os.path.join(d, "data.mdb"), "rb").read()
            shutil.rmtree(d)
            with open(os.path.join(OUT, name), "wb") as f:
                f.write(data)

    # Datums (caffe.proto: channels=1 height=2 width=3 data=4 label=5
    # float_data=6 encoded=7) and BlobProtos (num=1 channels=2 height=3
    # width=4 data=5 diff=6 shape=7 double_data=8)
    def varint(n):
        out = b""
        while True:
            b = n & 0x7F
            n >>= 7
            if n:
                out += bytes([b | 0x80])
            else:
                return out + bytes([b])

    def field(num, wt, payload):
        key = varint(num << 3 | wt)
        if wt == 0:
            return key + varint(payload)
        if wt == 2:
            return key + varint(len(payload)) + payload
        if wt == 5:
            return key + payload
        raise ValueError(wt)

    datums = {
        "raw_3x4x5": field(1, 0, 3) + field(2, 0, 4) + field(3, 0, 5)
        + field(4, 2, bytes(range(60))) + field(5, 0, 7),
        "raw_1x1x1": field(1, 0, 1) + field(2, 0, 1) + field(3, 0, 1)
        + field(4, 2, b"\xff") + field(5, 0, 2 ** 32 - 1),
        "float_packed": field(1, 0, 2) + field(2, 0, 2) + field(3, 0, 1)
        + field(6, 2, struct.pack("<4f", 1.5, -2, 0.25, 1e9)) + field(5, 0, 3),
        "float_unpacked": field(1, 0, 1) + field(2, 0, 1) + field(3, 0, 2)
        + field(6, 5, struct.pack("<f", 3.0)) + field(6, 5, struct.pack("<f", -1.0)),
        "encoded_png": field(4, 2, b"\x89PNG\r\n\x1a\n" + b"\0" * 24)
        + field(5, 0, 1) + field(7, 0, 1),
        "unknown_fields": field(15, 0, 12345) + field(1, 0, 1) + field(2, 0, 1)
        + field(3, 0, 1) + field(4, 2, b"A") + field(99, 2, b"skip me"),
        "blob_legacy": field(1, 0, 1) + field(2, 0, 1) + field(3, 0, 2) + field(4, 0, 2)
        + field(5, 2, struct.pack("<4f", 1, 2, 3, 4)),
        "blob_shape_double": field(7, 2, field(1, 2, varint(2) + varint(3)))
        + field(8, 2, struct.pack("<6d", 1, 2, 3, 4, 5, 6)),
    }
    for name, data in datums.items():
        with open(os.path.join(DOUT, name), "wb") as f:
            f.write(data)
    total = sum(os.path.getsize(os.path.join(OUT, n)) for n in os.listdir(OUT))
    print("corpus/lmdb: %d files, %d bytes; corpus/datum: %d files"
          % (len(os.listdir(OUT)), total, len(os.listdir(DOUT))))


if __name__ == "__main__":
    main()
