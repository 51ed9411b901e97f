/* Error reporting: fill a lio_error (lmdbio.h's codes and message).
 *
 * Layer 1 of the core (the first of: errors, page format, page cache,
 * environment, then cursors / index / plan / bulk / verify / copy).
 * May call: the C library only. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core.h"

int lio_fail(lio_error *err, int code, uint64_t pgno, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        err->code = code;
        err->sys_errno = 0;
        err->pgno = pgno;
        err->off = UINT64_MAX;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

int lio_fail_sys(lio_error *err, int sys_errno, uint64_t off, const char *what)
{
    if (err) {
        err->code = LIO_SYSERR;
        err->sys_errno = sys_errno;
        err->pgno = LIO_NO_PAGE;
        err->off = off;
        snprintf(err->msg, sizeof err->msg, "%s at offset %llu: %s", what,
                 (unsigned long long)off, strerror(sys_errno));
    }
    return LIO_SYSERR;
}
