/* A source and an executor over a byte buffer: the whole "file" in memory.
 * For the fuzz targets (fuzz/) and tests that feed the core plain bytes.
 *
 * Where bytes come from (as io_posix.c): below every layer that reads.
 * May call: errors.c (lio_fail) only. */
#include <stdlib.h>

#include "core.h"

static int64_t mem_read(void *ctx, uint64_t off, void *buf, size_t len)
{
    const lio_membuf *m = ctx;
    if (off >= m->size)
        return 0;
    if (len > m->size - off)
        len = (size_t)(m->size - off);
    memcpy(buf, m->data + off, len);
    return (int64_t)len;
}

static int64_t mem_readv(void *ctx, uint64_t off, const lio_seg *segs,
                         size_t nseg)
{
    int64_t done = 0;
    for (size_t i = 0; i < nseg; i++) {
        int64_t n = mem_read(ctx, off + (uint64_t)done, segs[i].dst,
                             segs[i].len);
        done += n;
        if ((size_t)n < segs[i].len)
            break;
    }
    return done;
}

static int64_t mem_size(void *ctx)
{
    const lio_membuf *m = ctx;
    return (int64_t)m->size;
}

void lio_mem_source(lio_source *src, lio_membuf *buf)
{
    src->ctx = buf;
    src->read = mem_read;
    src->size = mem_size;
    src->align = 1;
    src->readv = mem_readv;
    src->counted_reads = 0;   /* (never slow) */
    src->os_readahead = 0;
    src->read_cached = NULL;  /* (all of it is in memory) */
}

static int mem_run(void *ctx, const lio_plan *plan, lio_error *err)
{
    const lio_membuf *m = ctx;
    for (size_t i = 0; i < plan->nreads; i++) {
        const lio_read *r = &plan->reads[i];
        uint64_t off = r->off;
        if (off > m->size || r->len > m->size - off)
            return lio_fail(err, LIO_PAGE_NOTFOUND, LIO_NO_PAGE,
                            "the file ends at byte %llu, inside a planned "
                            "read", (unsigned long long)m->size);
        for (size_t s = 0; s < r->nseg; s++) {
            const lio_seg *seg = &plan->segs[r->first_seg + s];
            memcpy(seg->dst, m->data + off, seg->len);
            off += seg->len;
        }
    }
    return LIO_SUCCESS;
}

void lio_mem_executor(lio_executor *ex, lio_membuf *buf)
{
    ex->ctx = buf;
    ex->run = mem_run;
    ex->advise = NULL;
}
