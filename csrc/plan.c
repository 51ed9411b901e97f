/* Read plans: requests in ascending file order, coalesced into few large
 * scatter reads: adjacent and nearly adjacent extents are merged.
 *
 * Beside the page format, below the page cache (which plans its read-ahead
 * here), the index and the bulk reads.
 * May call: format.c (lio_grow) only. */
#include <stdlib.h>

#include "core.h"

#define MAX_SEGS_PER_READ 1024 /* IOV_MAX on Linux */

void lio_plan_init(lio_plan *plan, size_t max_gap, size_t max_read)
{
    memset(plan, 0, sizeof *plan);
    plan->max_gap = max_gap;
    plan->max_read = max_read ? max_read : (8u << 20);
    if (max_gap)
        plan->sink = malloc(max_gap);
    if (!plan->sink)
        plan->max_gap = 0;
}

void lio_plan_reset(lio_plan *plan)
{
    plan->nreads = plan->nsegs = 0;
    plan->bytes = 0;
}

void lio_plan_free(lio_plan *plan)
{
    free(plan->reads);
    free(plan->segs);
    free(plan->sink);
    memset(plan, 0, sizeof *plan);
}

static int add_seg(lio_plan *plan, uint8_t *dst, size_t len)
{
    lio_read *r = &plan->reads[plan->nreads - 1];
    if (r->nseg) {
        lio_seg *last = &plan->segs[plan->nsegs - 1];
        if (last->dst + last->len == dst && dst != plan->sink) {
            last->len += len;
            r->len += len;
            plan->bytes += len;
            return 0;
        }
    }
    if (lio_grow((void **)&plan->segs, &plan->segs_cap, plan->nsegs + 1,
             sizeof *plan->segs))
        return LIO_ENOMEM;
    plan->segs[plan->nsegs].dst = dst;
    plan->segs[plan->nsegs].len = len;
    plan->nsegs++;
    r->nseg++;
    r->len += len;
    plan->bytes += len;
    return 0;
}

int lio_plan_add_keeping_gap(lio_plan *plan, uint64_t off, uint8_t *dst,
                             size_t len, uint8_t *gap_dst, size_t gap_room,
                             size_t *gap)
{
    *gap = 0;
    if (len == 0)
        return 0;
    if (plan->nreads) {
        lio_read *r = &plan->reads[plan->nreads - 1];
        uint64_t end = r->off + r->len;
        if (off < end)
            return LIO_EINVAL; /* overlapping or unsorted requests */
        if (off - end <= plan->max_gap &&
            r->len + (off - end) + len <= plan->max_read &&
            r->nseg + 2 <= MAX_SEGS_PER_READ) {
            int rc = 0;
            if (off > end) {
                size_t g = (size_t)(off - end);
                int keep = gap_dst && g <= gap_room;
                rc = add_seg(plan, keep ? gap_dst : plan->sink, g);
                if (keep && !rc)
                    *gap = g;
            }
            return rc ? rc : add_seg(plan, dst, len);
        }
    }
    if (lio_grow((void **)&plan->reads, &plan->reads_cap, plan->nreads + 1,
             sizeof *plan->reads))
        return LIO_ENOMEM;
    plan->reads[plan->nreads].off = off;
    plan->reads[plan->nreads].first_seg = plan->nsegs;
    plan->reads[plan->nreads].nseg = 0;
    plan->reads[plan->nreads].len = 0;
    plan->nreads++;
    return add_seg(plan, dst, len);
}

int lio_plan_add(lio_plan *plan, uint64_t off, uint8_t *dst, size_t len)
{
    size_t gap;
    return lio_plan_add_keeping_gap(plan, off, dst, len, NULL, 0, &gap);
}

int lio_next_dense_region(const lio_readahead *ra, uint32_t psize,
                          const uint64_t *pages, size_t n, size_t *at,
                          uint64_t *reg)
{
    unsigned min_pages = ra && ra->min_pages ? ra->min_pages : 1;
    if (!ra || !ra->region)
        *at = n;
    while (*at < n) {
        size_t i = *at, j = i;
        uint64_t r = pages[i] * psize / ra->region;
        while (j < n && pages[j] * psize / ra->region == r)
            j++;
        *at = j;
        if (j - i >= min_pages) {
            *reg = r;
            return 1;
        }
    }
    return 0;
}
