/* The page format: meta pages, database records, the structural checks of
 * pages and leaves, key order.  Bytes in, structs and verdicts out: no I/O.
 *
 * With them, the small helpers every layer shares: sorting, growing arrays,
 * a lock that survives fork.
 *
 * Layer 2 of the core (after errors).
 * May call: errors.c (lio_fail), the C library and pthreads. */
#include <stdlib.h>
#include <unistd.h>

#include "core.h"

void lio_parse_dbrec(const uint8_t *p, lio_dbrec *db)
{
    db->pad = ld32(p);
    db->flags = ld16(p + 4);
    db->depth = ld16(p + 6);
    db->branch_pages = ld64(p + 8);
    db->leaf_pages = ld64(p + 16);
    db->overflow_pages = ld64(p + 24);
    db->entries = ld64(p + 32);
    db->root = ld64(p + 40);
}

int lio_decode_dbrec(const uint8_t *p, size_t len, lio_dbrec *db)
{
    if (len != DBREC_SIZE)
        return LIO_EINVAL;
    lio_parse_dbrec(p, db);
    return LIO_SUCCESS;
}

uint64_t lio_free_record(const uint8_t *p, size_t len, uint64_t *count)
{
    uint64_t have;
    if (len < 8) {
        *count = 0;
        return 0;
    }
    *count = ld64(p);
    have = (uint64_t)(len - 8) / 8;
    return *count < have ? *count : have;
}

uint64_t lio_free_page(const uint8_t *p, uint64_t i)
{
    return ld64(p + 8 + 8 * i);
}

uint64_t lio_free_key(const uint8_t *p, size_t len)
{
    uint8_t b[8] = {0};
    memcpy(b, p, len < 8 ? len : 8);
    return ld64(b);
}

int lio_check_dbrec(const lio_dbrec *db, uint64_t pgno, lio_error *err)
{
    if (db->flags & ~LIO_PERSISTENT_FLAGS)
        return lio_fail(err, LIO_INVALID, pgno,
                        "page %llu: database record has unknown flags 0x%x",
                        (unsigned long long)pgno, db->flags);
    if ((db->flags & (LIO_DUPFIXED | LIO_INTEGERDUP | LIO_REVERSEDUP)) &&
        !(db->flags & LIO_DUPSORT))
        return lio_fail(err, LIO_INVALID, pgno,
                        "page %llu: database flags 0x%x use DUPFIXED, "
                        "INTEGERDUP or REVERSEDUP without DUPSORT",
                        (unsigned long long)pgno, db->flags);
    if (db->root == LIO_EMPTY_ROOT)
        return LIO_SUCCESS;
    if (db->depth == 0 || db->depth > LIO_MAX_DEPTH)
        return lio_fail(err, LIO_CORRUPTED, pgno,
                        "page %llu: database record gives root page %llu an "
                        "impossible depth %u", (unsigned long long)pgno,
                        (unsigned long long)db->root, db->depth);
    if (db->root < 2)
        return lio_fail(err, LIO_CORRUPTED, pgno,
                        "page %llu: database root %llu is a meta page",
                        (unsigned long long)pgno, (unsigned long long)db->root);
    return LIO_SUCCESS;
}

/* What liblmdb checks of a meta page when it opens an environment
 * (mdb_env_read_header): P_META, the magic, the data version; fill *m. */
int lio_parse_meta_header(const uint8_t *p, size_t avail, uint64_t pgno,
                          lio_meta *m, lio_error *err)
{
    uint32_t magic, version;
    if (avail < META_END)
        return lio_fail(err, LIO_INVALID, pgno,
                        "meta page %llu is truncated: not an LMDB file",
                        (unsigned long long)pgno);
    magic = ld32(p + 16);
    if (magic != LMDB_MAGIC) {
        if (magic == __builtin_bswap32(LMDB_MAGIC))
            return lio_fail(err, LIO_INVALID, pgno,
                            "meta page %llu: byte-swapped magic: a big-endian "
                            "LMDB file, which this machine cannot read",
                            (unsigned long long)pgno);
        return lio_fail(err, LIO_INVALID, pgno,
                        "meta page %llu: bad magic 0x%08x: not an LMDB file",
                        (unsigned long long)pgno, magic);
    }
    if (!(pg_flags(p) & P_META))
        return lio_fail(err, LIO_INVALID, pgno,
                        "meta page %llu: page flags 0x%x lack P_META",
                        (unsigned long long)pgno, pg_flags(p));
    version = ld32(p + 20);
    if (version != LMDB_DATA_VERSION)
        return lio_fail(err, LIO_VERSION_MISMATCH, pgno,
                        "meta page %llu: data format version %u, expected %u",
                        (unsigned long long)pgno, version, LMDB_DATA_VERSION);
    m->address = ld64(p + 24);
    m->mapsize = ld64(p + 32);
    lio_parse_dbrec(p + 40, &m->free_db);
    lio_parse_dbrec(p + 88, &m->main_db);
    m->last_pg = ld64(p + 136);
    m->txnid = ld64(p + 144);
    m->psize = m->free_db.pad;
    m->env_flags = m->free_db.flags;
    return LIO_SUCCESS;
}

/* The header checks, then lmdbio's own: a page size lmdbio can read. */
int lio_parse_meta(const uint8_t *p, size_t avail, uint64_t pgno,
                   lio_meta *m, lio_error *err)
{
    uint32_t psize;
    int rc = lio_parse_meta_header(p, avail, pgno, m, err);
    if (rc)
        return rc;
    psize = m->psize;
    if (psize < 512 || psize > 32768 || (psize & (psize - 1)))
        return lio_fail(err, LIO_INVALID, pgno,
                        "meta page %llu: invalid page size %u",
                        (unsigned long long)pgno, psize);
    return LIO_SUCCESS;
}

/* Checks that need the whole snapshot: record flags, roots within it. */
int lio_check_snapshot(const lio_meta *m, uint64_t pgno, lio_error *err)
{
    int rc;
    const lio_dbrec *dbs[2] = {&m->free_db, &m->main_db};
    /* Every page number followed is checked against last_pg: bounding it
     * here keeps pgno * psize (a file offset) from overflowing. */
    if (m->last_pg < 1 || m->last_pg >= (uint64_t)INT64_MAX / m->psize)
        return lio_fail(err, LIO_INVALID, pgno,
                        "meta page %llu: last page %llu is impossible",
                        (unsigned long long)pgno, (unsigned long long)m->last_pg);
    /* The free DB's flags also carry environment flags: check only main's. */
    if ((rc = lio_check_dbrec(&m->main_db, pgno, err)))
        return rc;
    for (int i = 0; i < 2; i++) {
        const lio_dbrec *db = dbs[i];
        if (db->root == LIO_EMPTY_ROOT)
            continue;
        if (db->depth == 0 || db->depth > LIO_MAX_DEPTH || db->root < 2)
            return lio_fail(err, LIO_CORRUPTED, pgno,
                            "meta page %llu: %s database has root %llu depth %u",
                            (unsigned long long)pgno, i ? "main" : "free",
                            (unsigned long long)db->root, db->depth);
        if (db->root > m->last_pg)
            return lio_fail(err, LIO_PAGE_NOTFOUND, db->root,
                            "page %llu: %s database root is past the last "
                            "page %llu of the snapshot",
                            (unsigned long long)db->root, i ? "main" : "free",
                            (unsigned long long)m->last_pg);
    }
    return LIO_SUCCESS;
}


/* Check node offsets, key and data extents against the page bounds.
 * size is psize, or the sub-page's size for a DUPDATA sub-page. */
int lio_check_page(const uint8_t *p, uint32_t size, uint64_t pgno, int subpage,
                   lio_error *err)
{
    uint16_t flags = pg_flags(p), lower = pg_lower(p), upper = pg_upper(p);
    unsigned n, i;
    const char *what = subpage ? "sub-page of page" : "page";
    unsigned long long pg = (unsigned long long)pgno;
    uint16_t kind = flags & (P_BRANCH | P_LEAF | P_OVERFLOW | P_META);

    if (subpage) {
        if ((flags & ~(P_LEAF2 | P_DIRTY)) != (P_LEAF | P_SUBP))
            return lio_fail(err, LIO_CORRUPTED, pgno,
                            "%s %llu has flags 0x%x, not a leaf sub-page",
                            what, pg, flags);
    } else {
        if (flags & P_DIRTY)
            return lio_fail(err, LIO_CORRUPTED, pgno,
                            "page %llu has P_DIRTY set on disk (flags 0x%x)",
                            pg, flags);
        if ((kind != P_BRANCH && kind != P_LEAF) || (flags & P_SUBP) ||
            ((flags & P_LEAF2) && kind != P_LEAF))
            return lio_fail(err, LIO_CORRUPTED, pgno,
                            "page %llu has flags 0x%x, not a branch or leaf "
                            "page", pg, flags);
    }
    if (lower < PAGEHDRSZ || lower > upper || upper > size || (lower & 1))
        return lio_fail(err, LIO_CORRUPTED, pgno,
                        "%s %llu: bad free-space bounds lower=%u upper=%u "
                        "(size %u)", what, pg, lower, upper, size);
    n = (lower - PAGEHDRSZ) >> 1;
    /* liblmdb never commits an empty page: an emptied tree gets an
     * invalid root instead. */
    if (n == 0)
        return lio_fail(err, LIO_CORRUPTED, pgno, "%s %llu has no keys",
                        what, pg);
    if (flags & P_LEAF2) {
        /* Keys are fixed-size; the tree's key size is checked in context. */
        return LIO_SUCCESS;
    }
    for (i = 0; i < n; i++) {
        uint16_t off = ld16(p + PAGEHDRSZ + 2 * i);
        const uint8_t *nd;
        uint32_t end;
        if (off < lower || (off & 1) || (uint32_t)off + NODEHDRSZ > size)
            return lio_fail(err, LIO_CORRUPTED, pgno,
                            "%s %llu: node %u offset %u is outside the node "
                            "area", what, pg, i, off);
        nd = p + off;
        end = (uint32_t)off + NODEHDRSZ + nd_ksize(nd);
        if (end > size)
            return lio_fail(err, LIO_CORRUPTED, pgno,
                            "%s %llu: node %u key size %u runs past the page",
                            what, pg, i, nd_ksize(nd));
        if (flags & P_BRANCH)
            continue;
        {
            uint16_t nf = nd_flags(nd);
            uint32_t dsize = nd_dsize(nd);
            if (nf & ~(F_BIGDATA | F_SUBDATA | F_DUPDATA))
                return lio_fail(err, LIO_CORRUPTED, pgno,
                                "%s %llu: node %u has unknown flags 0x%x",
                                what, pg, i, nf);
            if (nf & F_BIGDATA) {
                if (nf != F_BIGDATA)
                    return lio_fail(err, LIO_CORRUPTED, pgno,
                                    "%s %llu: node %u mixes F_BIGDATA with "
                                    "flags 0x%x", what, pg, i, nf);
                if (end + 8 > size)
                    return lio_fail(err, LIO_CORRUPTED, pgno,
                                    "%s %llu: node %u overflow page number "
                                    "runs past the page", what, pg, i);
                continue;
            }
            if (subpage && nf)
                return lio_fail(err, LIO_CORRUPTED, pgno,
                                "%s %llu: node %u of a sub-page has flags 0x%x",
                                what, pg, i, nf);
            if ((uint64_t)end + dsize > size)
                return lio_fail(err, LIO_CORRUPTED, pgno,
                                "%s %llu: node %u data size %u runs past the "
                                "page", what, pg, i, dsize);
            if ((nf & F_SUBDATA) && dsize != DBREC_SIZE)
                return lio_fail(err, LIO_CORRUPTED, pgno,
                                "%s %llu: node %u holds a database record of "
                                "%u bytes, not %d", what, pg, i, dsize,
                                DBREC_SIZE);
            if (nf == F_DUPDATA && dsize < PAGEHDRSZ)
                return lio_fail(err, LIO_CORRUPTED, pgno,
                                "%s %llu: node %u sub-page of %u bytes is "
                                "smaller than a page header", what, pg, i,
                                dsize);
        }
    }
    return LIO_SUCCESS;
}

/* ---- leaves, as the record index reads them ------------------------------ */

int lio_check_leaf_header(const uint8_t *p, uint32_t psize, uint64_t pgno,
                          lio_error *err)
{
    uint16_t lower = pg_lower(p), upper = pg_upper(p);
    if (pg_pgno(p) != pgno)
        return lio_fail(err, LIO_CORRUPTED, pgno,
                        "page %llu carries page number %llu in its header",
                        (unsigned long long)pgno,
                        (unsigned long long)pg_pgno(p));
    if (pg_flags(p) != P_LEAF)
        return lio_fail(err, LIO_CORRUPTED, pgno,
                        "page %llu has flags 0x%x where the tree's depth puts "
                        "a leaf", (unsigned long long)pgno, pg_flags(p));
    if (lower <= PAGEHDRSZ || lower > upper || upper > psize || (lower & 1))
        return lio_fail(err, LIO_CORRUPTED, pgno,
                        "page %llu: bad free-space bounds lower=%u upper=%u",
                        (unsigned long long)pgno, lower, upper);
    return LIO_SUCCESS;
}

int lio_leaf_dup_records(const uint8_t *p, uint32_t psize, uint64_t pgno,
                         uint64_t *count, lio_error *err)
{
    unsigned n = pg_numkeys(p);
    uint64_t total = 0;
    for (unsigned i = 0; i < n; i++) {
        const uint8_t *nd = pg_node(p, i);
        uint16_t f = nd_flags(nd);
        if (!(f & F_DUPDATA)) {
            total++;
        } else if (f & F_SUBDATA) {
            lio_dbrec rec;
            lio_parse_dbrec(nd_data(nd), &rec);
            if (rec.entries == 0 || rec.root == LIO_EMPTY_ROOT)
                return lio_fail(err, LIO_CORRUPTED, pgno,
                                "page %llu: node %u has an empty duplicate "
                                "sub-database", (unsigned long long)pgno, i);
            total += rec.entries;
        } else {
            const uint8_t *sp = nd_data(nd);
            int rc = lio_check_page(sp, nd_dsize(nd), pgno, 1, err);
            if (rc)
                return rc;
            total += pg_numkeys(sp);
        }
    }
    (void)psize;
    *count = total;
    return LIO_SUCCESS;
}

/* ---- comparison ---------------------------------------------------------- */

int lio_cmp(int kind, const lio_val *a, const lio_val *b)
{
    size_t n;
    int d;
    switch (kind) {
    case LIO_CMP_INT: {
        /* Native unsigned integers compared by value (liblmdb compares
         * a->size bytes of both, most significant first). */
        size_t i = a->size;
        while (i-- > 0) {
            unsigned ab = a->data[i], bb = i < b->size ? b->data[i] : 0;
            if (ab != bb)
                return ab < bb ? -1 : 1;
        }
        return 0;
    }
    case LIO_CMP_MEMNR: {
        const uint8_t *pa = a->data + a->size, *pb = b->data + b->size;
        n = a->size < b->size ? a->size : b->size;
        while (n-- > 0) {
            d = (int)*--pa - (int)*--pb;
            if (d)
                return d;
        }
        break;
    }
    default:
        n = a->size < b->size ? a->size : b->size;
        d = n ? memcmp(a->data, b->data, n) : 0;
        if (d)
            return d;
    }
    return a->size < b->size ? -1 : a->size > b->size;
}

int lio_key_cmp_kind(uint16_t flags)
{
    if (flags & LIO_REVERSEKEY)
        return LIO_CMP_MEMNR;
    if (flags & LIO_INTEGERKEY)
        return LIO_CMP_INT;
    return LIO_CMP_MEMN;
}

int lio_dup_cmp_kind(uint16_t flags)
{
    if (flags & LIO_INTEGERDUP)
        return LIO_CMP_INT;
    if (flags & LIO_REVERSEDUP)
        return LIO_CMP_MEMNR;
    return LIO_CMP_MEMN;
}

/* qsort order of uint64_t values (page numbers). */
int lio_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

void lio_sort_u64(uint64_t *a, size_t n, size_t words)
{
    enum { BITS = 11, BINS = 1 << BITS };
    size_t sz = words * sizeof *a, *count;
    uint64_t top = 0, *tmp, *src = a, *dst;
    unsigned passes = 0;
    if (n < 64) {   /* insertion sort: few elements, stable */
        uint64_t e[4];
        for (size_t i = 1; i < n; i++) {
            size_t j = i;
            memcpy(e, a + i * words, sz);
            for (; j > 0 && a[(j - 1) * words] > e[0]; j--)
                memcpy(a + j * words, a + (j - 1) * words, sz);
            memcpy(a + j * words, e, sz);
        }
        return;
    }
    for (size_t i = 0; i < n; i++)
        top |= a[i * words];
    while (top >> (passes * BITS))
        passes++;
    tmp = malloc(n * sz);
    count = malloc(BINS * sizeof *count);
    if (!tmp || !count) {
        free(tmp);
        free(count);
        qsort(a, n, sz, lio_cmp_u64);
        return;
    }
    dst = tmp;
    /* least significant digit first: each pass keeps the order of the
     * last among equal digits */
    for (unsigned p = 0; p < passes; p++) {
        unsigned shift = p * BITS;
        size_t sum = 0;
        uint64_t *t;
        memset(count, 0, BINS * sizeof *count);
        for (size_t i = 0; i < n; i++)
            count[(src[i * words] >> shift) & (BINS - 1)]++;
        for (size_t d = 0; d < BINS; d++) {
            size_t c = count[d];
            count[d] = sum;
            sum += c;
        }
        for (size_t i = 0; i < n; i++) {
            size_t at = count[(src[i * words] >> shift) & (BINS - 1)]++;
            memcpy(dst + at * words, src + i * words, sz);
        }
        t = src;
        src = dst;
        dst = t;
    }
    if (src != a)
        memcpy(a, src, n * sz);
    free(tmp);
    free(count);
}

int lio_grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    size_t ncap;
    void *p;
    if (need <= *cap)
        return 0;
    ncap = *cap ? *cap : 64;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2)
            return -1;
        ncap *= 2;
    }
    if (elem && ncap > SIZE_MAX / elem)
        return -1;
    p = realloc(*arr, ncap * elem);
    if (!p)
        return -1;
    *arr = p;
    *cap = ncap;
    return 0;
}

/* (held only while a child makes a lock anew) */
static pthread_mutex_t remaking = PTHREAD_MUTEX_INITIALIZER;

void lio_lock_here(pthread_mutex_t *m, pid_t *made_by)
{
    pid_t me = getpid();
    if (__atomic_load_n(made_by, __ATOMIC_ACQUIRE) != me) {
        pthread_mutex_lock(&remaking);
        if (__atomic_load_n(made_by, __ATOMIC_RELAXED) != me) {
            pthread_mutex_init(m, NULL);
            __atomic_store_n(made_by, me, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&remaking);
    }
    pthread_mutex_lock(m);
}
