/* The POSIX executor: pread, optionally with O_DIRECT. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h"

struct lio_posix {
    int fd;
    size_t align;
};

static int64_t posix_read(void *ctx, uint64_t off, void *buf, size_t len)
{
    lio_posix *p = ctx;
    for (;;) {
        ssize_t n = pread(p->fd, buf, len, (off_t)off);
        if (n >= 0)
            return n;
        if (errno != EINTR)
            return -errno;
    }
}

static int64_t posix_size(void *ctx)
{
    lio_posix *p = ctx;
    struct stat st;
    if (fstat(p->fd, &st) < 0)
        return -errno;
    return st.st_size;
}

int lio_posix_open(lio_posix **out, const char *path, int direct,
                   lio_error *err)
{
    lio_posix *p;
    int flags = O_RDONLY | O_CLOEXEC;
    struct stat st;

    *out = NULL;
    if (direct)
        flags |= O_DIRECT;
    p = calloc(1, sizeof *p);
    if (!p)
        return lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
    p->align = 1;
    p->fd = open(path, flags);
    if (p->fd < 0) {
        int e = errno;
        free(p);
        if (direct && e == EINVAL)
            return lio_fail(err, LIO_EINVAL, LIO_NO_PAGE,
                            "%s: the filesystem refuses O_DIRECT", path);
        lio_fail_sys(err, e, 0, "cannot open the data file");
        return LIO_SYSERR;
    }
    if (fstat(p->fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        int e = errno;
        int isdir = S_ISDIR(st.st_mode);
        close(p->fd);
        free(p);
        if (isdir)
            return lio_fail(err, LIO_INVALID, LIO_NO_PAGE,
                            "%s is a directory, not an LMDB data file", path);
        if (e)
            return lio_fail_sys(err, e, 0, "cannot stat the data file");
        return lio_fail(err, LIO_INVALID, LIO_NO_PAGE,
                        "%s is not a regular file", path);
    }
    if (direct) {
        /* O_DIRECT needs offsets, lengths and buffers aligned to the
         * logical block size; 4096 covers every device we meet. */
        p->align = 4096;
        if (st.st_blksize > 4096 && (st.st_blksize & (st.st_blksize - 1)) == 0)
            p->align = (size_t)st.st_blksize;
    }
    *out = p;
    return LIO_SUCCESS;
}

void lio_posix_get_source(lio_posix *p, lio_source *src)
{
    src->ctx = p;
    src->read = posix_read;
    src->size = posix_size;
    src->align = p->align;
}

void lio_posix_close(lio_posix *p)
{
    if (!p)
        return;
    close(p->fd);
    free(p);
}
