"""What a run of ``lmdbio bench`` could have reached: each lmdbio row's
ratio against its peer next to the best ratio the machine's limits allow.

    python -m lmdbio bench --fresh DIR ... --modes hot,cold \\
        --peers pread,py-lmdb,lmdbio,lmdbio-reader,py-lmdb-get,lmdbio-get,lmdbio-shuffled \\
        --json run.json
    python benches/bounds.py run.json [--no-limits] [--json bounds.json]

Cold (the page cache dropped before each run), with ``load`` the cold
``pread`` peer's time (one sequential read of data.mdb: the storage's
limit) and ``hot`` the row's own hot time from the same run:

- ``overlap``: the peer's cold time over max(load, hot), the best any
  reader could do whose reads and work overlap completely: a walk in file
  order, where the reads run ahead of the records;
- ``serial``: the peer's cold time over load + hot, the best where they
  cannot overlap: in key order over a file written in random order, or a
  shuffled epoch, the first window's records lie all over the file, so
  the window waits for nearly all of it, and the windows after it
  (memory bounds how many are read ahead) find it cached.

Hot, for the shuffled Reader (one read a record): ``floor`` = records x
the time of one random read of the records' mean size on two threads
(``benches/limits.c``, measured now over the same file, hot), plus for a
first start one sequential read of the file on two threads (the index
build reads every leaf); the bound is the peer's hot time over the floor.

The limits are measured when this runs, after the bench: run it right
after, on the same machine (``--no-limits`` prints the cold bounds only).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# lmdbio's rows and the peer each is compared with.
REFERENCE = {
    "lmdbio": "py-lmdb",
    "lmdbio-reader/first": "py-lmdb",
    "lmdbio-reader/later": "py-lmdb",
    "lmdbio-get": "py-lmdb-get",
    "lmdbio-shuffled/first": "py-lmdb-get",
    "lmdbio-shuffled/later": "py-lmdb-get",
}


def _medians(result: dict) -> dict:
    return {r["peer"]: r["seconds_median"] for r in result["rows"]}


def cold_bounds(results: list[dict]) -> list[dict]:
    """For every dataset measured hot and cold with a cold pread row: each
    lmdbio row's measured cold ratio and its overlap and serial bounds."""
    hot = {r["path"]: _medians(r) for r in results if r["mode"] == "hot"}
    out = []
    for res in results:
        if res["mode"] != "cold" or res["path"] not in hot:
            continue
        cold = _medians(res)
        load = cold.get("pread")
        if not load:
            continue
        for peer, ref in REFERENCE.items():
            if peer not in cold or ref not in cold or peer not in hot[res["path"]]:
                continue
            own_hot = hot[res["path"]][peer]
            out.append(dict(
                dataset=res["dataset"], peer=peer, vs=ref, load=load,
                hot=own_hot, cold=cold[peer],
                measured=cold[ref] / cold[peer],
                overlap=cold[ref] / max(load, own_hot),
                serial=cold[ref] / (load + own_hot)))
    return out


def mean_value_bytes(path: str, sample: int = 2000) -> float:
    """The mean value size of a sample of the environment's records."""
    import numpy as np
    import lmdbio
    with lmdbio.Reader(path, batch_size=256, lock=False,
                       index_cache=False) as r:
        n = r.total_records
        if n == 0:
            return 0.0
        picks = np.random.default_rng(0).choice(n, size=min(sample, n),
                                                replace=False)
        batch = r.read(np.sort(picks))
        return float(batch.values.offsets[-1]) / len(batch)


def hot_floor(records: int, read_us_two: float, file_bytes: int = 0,
              seq_GBps_two: float = 0.0) -> float:
    """Seconds a shuffled epoch of `records` reads cannot beat on two
    threads; with file_bytes, plus one read of the whole file (a first
    start's index build)."""
    t = records * read_us_two * 1e-6
    if file_bytes and seq_GBps_two:
        t += file_bytes / (seq_GBps_two * 1e9)
    return t


def hot_bounds(results: list[dict], measure=None) -> list[dict]:
    """The shuffled rows' hot bounds; `measure(path, size)` gives
    (us a random read of size bytes, sequential GB/s), two threads."""
    if measure is None:
        measure = _measure_limits
    out = []
    for res in results:
        if res["mode"] != "hot":
            continue
        med = _medians(res)
        ref = med.get("py-lmdb-get")
        rows = [p for p in ("lmdbio-shuffled/first", "lmdbio-shuffled/later")
                if p in med]
        if not ref or not rows:
            continue
        size = max(1, int(round(mean_value_bytes(res["path"]))))
        read_us, seq = measure(res["path"], size)
        for peer in rows:
            first = peer.endswith("/first")
            floor = hot_floor(res["records"], read_us,
                              res["file_bytes"] if first else 0, seq)
            out.append(dict(dataset=res["dataset"], peer=peer,
                            vs="py-lmdb-get", value_bytes=size,
                            read_us=read_us, floor=floor, seconds=med[peer],
                            measured=ref / med[peer], bound=ref / floor))
    return out


def _measure_limits(path: str, size: int):
    if HERE not in sys.path:   # (once, not once a dataset)
        sys.path.insert(0, HERE)
    import limits
    data = os.path.join(path, "data.mdb") if os.path.isdir(path) else path
    rows = limits.measure(data, [size])
    get = {(r["name"], r["threads"]): r["value"] for r in rows}
    return get[(f"rand_pread_{size}", 2)], get[("seq_pread", 2)]


def format_bounds(cold: list[dict], hot: list[dict]) -> str:
    lines = []
    if cold:
        lines += ["cold: x peer measured, and the best reachable with the "
                  "reads and the work overlapping fully / not at all",
                  f"{'dataset':<12} {'row':<22} {'vs':<12} {'load s':>7} "
                  f"{'hot s':>7} {'cold s':>7} {'measured':>9} "
                  f"{'overlap':>8} {'serial':>7}"]
        for b in cold:
            lines.append(f"{b['dataset']:<12} {b['peer']:<22} {b['vs']:<12} "
                         f"{b['load']:7.3f} {b['hot']:7.3f} {b['cold']:7.3f} "
                         f"{b['measured']:8.2f}x {b['overlap']:7.2f}x "
                         f"{b['serial']:6.2f}x")
    if hot:
        lines += ["", "hot, shuffled: x py-lmdb-get measured, and at one "
                  "random read a record on two threads (the floor)",
                  f"{'dataset':<12} {'row':<22} {'value B':>8} {'us/read':>8} "
                  f"{'floor s':>8} {'s':>7} {'measured':>9} {'bound':>7}"]
        for b in hot:
            lines.append(f"{b['dataset']:<12} {b['peer']:<22} "
                         f"{b['value_bytes']:8d} {b['read_us']:8.3f} "
                         f"{b['floor']:8.3f} {b['seconds']:7.3f} "
                         f"{b['measured']:8.2f}x {b['bound']:6.2f}x")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__)
    ap.add_argument("run", help="the JSON file of an lmdbio bench run (--json)")
    ap.add_argument("--no-limits", action="store_true",
                    help="skip the hot floors (they measure the machine now)")
    ap.add_argument("--json", help="also write the bounds here")
    a = ap.parse_args(argv)
    try:
        with open(a.run) as f:
            results = json.load(f)["results"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"bounds: {a.run}: not the JSON of an lmdbio bench "
                         f"run ({e}); write one with lmdbio bench --json FILE")
    cold = cold_bounds(results)
    hot = [] if a.no_limits else hot_bounds(results)
    if not cold and not hot:
        raise SystemExit("bounds: nothing to bound: the run needs hot and "
                         "cold modes with the pread peer (cold bounds), or "
                         "lmdbio-shuffled and py-lmdb-get hot (hot floors)")
    print(format_bounds(cold, hot))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(cold=cold, hot=hot), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
