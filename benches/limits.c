/* What the machine allows, for the benchmarks' ratios: C loops with no
 * library in the way, over one file from the OS page cache.
 *
 *   limits FILE SIZE...      (built and run by benches/limits.py)
 *
 * Prints one line per measurement, "name threads value unit":
 *   seq_pread     the file read in order into one reused 2 MiB buffer
 *                 (what raw pread does): GB/s of the file
 *   seq_pread_out the same reads straight into an output as large as the
 *                 file (one copy into memory that does not stay cached)
 *   seq_two_copy  pread into a 2 MiB buffer, then memcpy into the output:
 *                 a reader that must rearrange records (the Reader in
 *                 key order: leaves into a buffer, records into batches)
 *   memcpy        memory to memory, output as above
 *   rand_pread_N  random N-byte reads at page offsets of the file, each
 *                 into the next place of the output (a shuffled record
 *                 into its batch): microseconds a read, wall time over
 *                 reads (with two threads: both together)
 *   fault         first touch of fresh anonymous memory: microseconds a
 *                 4 KiB page (every new buffer of a fresh process pays it)
 * Two threads split the work in halves.  Each figure is the best of
 * ROUNDS rounds: the machine's capacity, not a typical run. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (2u << 20)
#define ROUNDS 5
#define RAND_READS 200000u

enum { SEQ_PREAD, SEQ_PREAD_OUT, SEQ_TWO_COPY, MEMCPY, RAND_PREAD };

static int fd;
static size_t file_size;
static uint8_t *out, *src;
static uint64_t *offsets;

typedef struct {
    int what;
    size_t lo, hi;     /* bytes (sequential) or reads (random) */
    size_t len;        /* random read size */
    uint8_t *buf;
    int failed;
} job;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int read_full(uint8_t *dst, size_t n, size_t off)
{
    while (n) {
        ssize_t got = pread(fd, dst, n, (off_t)off);
        if (got <= 0)
            return -1;
        dst += got;
        n -= (size_t)got;
        off += (size_t)got;
    }
    return 0;
}

static void *run(void *arg)
{
    job *j = arg;
    if (j->what == RAND_PREAD) {
        /* each into the next place of the output, as records into a
         * batch (a reused buffer would stay in the CPU's caches) */
        size_t at = j->lo * j->len % (file_size - j->len + 1);
        for (size_t i = j->lo; i < j->hi && !j->failed; i++) {
            j->failed = read_full(out + at, j->len, offsets[i]);
            at += j->len;
            if (at > file_size - j->len)
                at = 0;
        }
        return NULL;
    }
    for (size_t off = j->lo; off < j->hi && !j->failed; off += CHUNK) {
        size_t n = j->hi - off < CHUNK ? j->hi - off : CHUNK;
        switch (j->what) {
        case SEQ_PREAD:
            j->failed = read_full(j->buf, n, off);
            break;
        case SEQ_PREAD_OUT:
            j->failed = read_full(out + off, n, off);
            break;
        case SEQ_TWO_COPY:
            j->failed = read_full(j->buf, n, off);
            memcpy(out + off, j->buf, n);
            break;
        default:
            memcpy(out + off, src + off, n);
        }
    }
    return NULL;
}

/* Best seconds of ROUNDS runs of `what` over [0, total) on `threads`. */
static double best(int what, int threads, size_t total, size_t len)
{
    double top = 1e30;
    for (int r = 0; r < ROUNDS; r++) {
        pthread_t t[2];
        job j[2];
        double t0 = now(), dt;
        for (int i = 0; i < threads; i++) {
            size_t step = what == RAND_PREAD ? 1 : CHUNK;
            size_t half = total / (size_t)threads / step * step;
            j[i].what = what;
            j[i].lo = half * (size_t)i;
            j[i].hi = i == threads - 1 ? total : half * (size_t)(i + 1);
            j[i].len = len;
            j[i].failed = 0;
            if (posix_memalign((void **)&j[i].buf, 4096, CHUNK)) {
                fprintf(stderr, "limits: out of memory\n");
                exit(2);
            }
            memset(j[i].buf, 0, CHUNK);
        }
        t0 = now();
        for (int i = 0; i < threads; i++)
            pthread_create(&t[i], NULL, run, &j[i]);
        for (int i = 0; i < threads; i++)
            pthread_join(t[i], NULL);
        dt = now() - t0;
        for (int i = 0; i < threads; i++) {
            free(j[i].buf);
            if (j[i].failed) {
                fprintf(stderr, "limits: a read of the file failed\n");
                exit(2);
            }
        }
        if (dt < top)
            top = dt;
    }
    return top;
}

static double fault_us(void)
{
    size_t bytes = 64u << 20, pages = bytes / 4096;
    double top = 1e30;
    for (int r = 0; r < ROUNDS; r++) {
        uint8_t *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        double t0, dt;
        if (p == MAP_FAILED) {
            fprintf(stderr, "limits: out of memory\n");
            exit(2);
        }
        t0 = now();
        for (size_t i = 0; i < pages; i++)
            p[i * 4096] = 1;
        dt = now() - t0;
        munmap(p, bytes);
        if (dt < top)
            top = dt;
    }
    return top * 1e6 / (double)pages;
}

int main(int argc, char **argv)
{
    static const char *names[] = {"seq_pread", "seq_pread_out",
                                  "seq_two_copy", "memcpy"};
    uint64_t x = 88172645463325252ull;
    size_t pages;
    if (argc < 2) {
        fprintf(stderr, "usage: limits FILE [SIZE...]\n");
        return 2;
    }
    if ((fd = open(argv[1], O_RDONLY)) < 0) {
        perror(argv[1]);
        return 2;
    }
    file_size = (size_t)lseek(fd, 0, SEEK_END);
    pages = file_size / 4096;
    if (pages < 4) {
        fprintf(stderr, "limits: %s is too small\n", argv[1]);
        return 2;
    }
    out = malloc(file_size);
    src = malloc(file_size);
    offsets = malloc(RAND_READS * sizeof *offsets);
    if (!out || !src || !offsets) {
        fprintf(stderr, "limits: out of memory\n");
        return 2;
    }
    memset(out, 1, file_size);   /* touched: no first-touch faults timed */
    memset(src, 2, file_size);
    for (int what = SEQ_PREAD; what <= MEMCPY; what++)
        for (int th = 1; th <= 2; th++)
            printf("%s %d %.3f GB/s\n", names[what], th,
                   (double)file_size / best(what, th, file_size, 0) / 1e9);
    for (int a = 2; a < argc; a++) {
        size_t len = (size_t)strtoul(argv[a], NULL, 10);
        if (len == 0 || len > CHUNK || len > file_size - 4096) {
            fprintf(stderr, "limits: a read of %s bytes does not fit\n",
                    argv[a]);
            return 2;
        }
        for (size_t i = 0; i < RAND_READS; i++) {
            /* xorshift: page-aligned offsets, each read inside the file */
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            offsets[i] = x % ((file_size - len) / 4096 + 1) * 4096;
        }
        for (int th = 1; th <= 2; th++)
            printf("rand_pread_%zu %d %.3f us\n", len, th,
                   best(RAND_PREAD, th, RAND_READS, len) * 1e6 / RAND_READS);
    }
    printf("fault 1 %.3f us\n", fault_us());
    return 0;
}
